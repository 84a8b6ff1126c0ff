/* config.c: (being written) */
