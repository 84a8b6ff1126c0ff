/* test_fil_expect.h: the failure counter and EXPECT of flashinfer_like's host tests. */
#ifndef AP_TEST_FIL_EXPECT_H
#define AP_TEST_FIL_EXPECT_H

#include <stdio.h>

static int failures;

/* Counts a failure and says where and why, then goes on: one run reports every broken case. */
#define EXPECT(cond, ...) \
    do { \
        if (!(cond)) { \
            failures++; \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); \
            fprintf(stderr, "\n"); \
        } \
    } while (0)

#endif /* AP_TEST_FIL_EXPECT_H */
