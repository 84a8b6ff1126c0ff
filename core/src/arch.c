/* arch.c: (being written) */
