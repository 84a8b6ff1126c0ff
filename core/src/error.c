/* error.c: (being written) */
