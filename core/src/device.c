/* device.c: (being written) */
