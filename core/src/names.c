/* names.c: (being written) */
