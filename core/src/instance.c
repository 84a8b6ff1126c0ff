/* instance.c: (being written) */
