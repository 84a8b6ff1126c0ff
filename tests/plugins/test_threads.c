/* test_threads.c: scans from four threads at once give the result of one scan on one thread. */
#include <pthread.h>

#include "test_support.h"

#define NUM_THREADS 4
#define ROUNDS 8

static const char *search_dirs[2];

/* The single-threaded reference every concurrent outcome must equal, record by record. */
static void assert_same_registry(const ap_registry *reference, const ap_registry *registry) {
    size_t count = ap_registry_file_count(reference);
    assert_int_equal(ap_registry_file_count(registry), count);
    for (size_t i = 0; i < count; i++) {
        ap_file_record want, got;
        assert_int_equal(ap_registry_file(reference, i, &want), AP_OK);
        assert_int_equal(ap_registry_file(registry, i, &got), AP_OK);
        assert_string_equal(got.path, want.path);
        assert_int_equal(got.status, want.status);
        assert_string_equal(got.message, want.message);
        if (want.backend == NULL)
            assert_null(got.backend);
        else
            assert_string_equal(got.backend, want.backend);
    }
    count = ap_registry_backend_count(reference);
    assert_int_equal(ap_registry_backend_count(registry), count);
    for (size_t i = 0; i < count; i++)
        assert_string_equal(ap_registry_backend(registry, i)->name,
                            ap_registry_backend(reference, i)->name);
}

typedef struct thread_job {
    pthread_barrier_t *start;
    ap_registry *shared; /* scanned by every thread; NULL: each thread makes its own */
    ap_status statuses[ROUNDS];
    size_t backends[ROUNDS];
    int errors_clean; /* ap_last_error() of this thread is "" after its successful scans */
} thread_job;

static void *scan_shared(void *arg) {
    thread_job *job = arg;
    pthread_barrier_wait(job->start);
    job->statuses[0] = ap_registry_scan(job->shared);
    job->errors_clean = strcmp(ap_last_error(), "") == 0;
    job->backends[0] = ap_registry_backend_count(job->shared);
    return NULL;
}

/* Each thread builds, scans and destroys registries of its own: the same plugin files are
 * dlopen'd and dlclose'd by several threads at once. */
static void *scan_own(void *arg) {
    thread_job *job = arg;
    pthread_barrier_wait(job->start);
    job->errors_clean = 1;
    for (int round = 0; round < ROUNDS; round++) {
        ap_registry_options options = {sizeof options, search_dirs, 2,
                                       AP_REGISTRY_NO_DEFAULT_PATHS};
        ap_registry *registry = NULL;
        job->statuses[round] = ap_registry_create(&options, &registry);
        if (job->statuses[round] != AP_OK) continue;
        job->statuses[round] = ap_registry_scan(registry);
        job->errors_clean &= strcmp(ap_last_error(), "") == 0;
        job->backends[round] =
            ap_registry_find(registry, "good") != NULL ? ap_registry_backend_count(registry) : 0;
        ap_registry_destroy(registry);
    }
    return NULL;
}

static void run_threads(void *(*body)(void *), thread_job *jobs) {
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, NUM_THREADS), 0);
    pthread_t threads[NUM_THREADS];
    for (int t = 0; t < NUM_THREADS; t++) {
        jobs[t].start = &start;
        assert_int_equal(pthread_create(&threads[t], NULL, body, &jobs[t]), 0);
    }
    for (int t = 0; t < NUM_THREADS; t++) assert_int_equal(pthread_join(threads[t], NULL), 0);
    pthread_barrier_destroy(&start);
}

static void test_shared_registry(void **state) {
    (void)state;
    ap_registry *reference = test_registry_scanned(search_dirs, 2);
    ap_registry *shared = test_registry(search_dirs, 2, AP_REGISTRY_NO_DEFAULT_PATHS);
    thread_job jobs[NUM_THREADS] = {{0}};
    for (int t = 0; t < NUM_THREADS; t++) jobs[t].shared = shared;
    run_threads(scan_shared, jobs);
    for (int t = 0; t < NUM_THREADS; t++) {
        assert_int_equal(jobs[t].statuses[0], AP_OK);
        assert_true(jobs[t].errors_clean);
        /* A scan returns once the files are loaded, whichever thread loaded them. */
        assert_int_equal(jobs[t].backends[0], 4);
    }
    assert_same_registry(reference, shared);
    assert_int_equal(ap_registry_destroy(shared), AP_OK);
    assert_int_equal(ap_registry_destroy(reference), AP_OK);
}

static void test_registries_per_thread(void **state) {
    (void)state;
    thread_job jobs[NUM_THREADS] = {{0}};
    run_threads(scan_own, jobs);
    for (int t = 0; t < NUM_THREADS; t++) {
        assert_true(jobs[t].errors_clean);
        for (int round = 0; round < ROUNDS; round++) {
            assert_int_equal(jobs[t].statuses[round], AP_OK);
            assert_int_equal(jobs[t].backends[round], 4); /* alpha, create_fails, dup, good */
        }
    }
}

/* The last error belongs to the thread that failed. */
static void *fail_once(void *arg) {
    thread_job *job = arg;
    pthread_barrier_wait(job->start);
    ap_registry_scan(NULL);
    job->errors_clean = strstr(ap_last_error(), "registry is NULL") != NULL;
    return NULL;
}

static void test_last_error_per_thread(void **state) {
    (void)state;
    ap_registry *empty = NULL;
    assert_int_equal(ap_registry_create(NULL, &empty), AP_OK); /* success clears the error */
    assert_int_equal(ap_registry_destroy(empty), AP_OK);
    assert_string_equal(ap_last_error(), "");
    thread_job jobs[NUM_THREADS] = {{0}};
    run_threads(fail_once, jobs);
    for (int t = 0; t < NUM_THREADS; t++) assert_true(jobs[t].errors_clean);
    assert_string_equal(ap_last_error(), "");
}

int main(void) {
    search_dirs[0] = test_dir("AP_TEST_BROKEN_DIR");
    search_dirs[1] = test_dir("AP_TEST_SECOND_DIR");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_registry),
        cmocka_unit_test(test_registries_per_thread),
        cmocka_unit_test(test_last_error_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
