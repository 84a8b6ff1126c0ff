/* select.c: (being written) */
