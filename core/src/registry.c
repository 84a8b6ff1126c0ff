/* registry.c: (being written) */
