/* test_instance.c: a plugin whose create fails is reported, and no plugin unloads under an instance. */
#include "test_support.h"

static void test_create_fails(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry_scanned(&dir, 1);
    ap_model model = test_fixture_model();
    ap_device cpu;
    ap_device_cpu(&cpu, "");
    ap_instance *instance = (ap_instance *)&model; /* must come back NULL */
    assert_int_equal(ap_instance_open(registry, "create_fails", &model, NULL, &cpu, &instance),
                     AP_ERR_OUT_OF_MEMORY);
    assert_null(instance);
    assert_contains(ap_last_error(), "create_fails");
    assert_contains(ap_last_error(), "fixture 'create_fails' fails create on purpose");
    /* The failed create left no instance behind: the registry may go. */
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

static void test_no_unload_under_live_instance(void **state) {
    (void)state;
    const char *dir = test_dir("AP_TEST_BROKEN_DIR");
    ap_registry *registry = test_registry_scanned(&dir, 1);
    ap_model model = test_fixture_model();
    ap_device cpu;
    ap_device_cpu(&cpu, "");
    ap_instance *instance = NULL;
    assert_int_equal(ap_instance_open(registry, "good", &model, NULL, &cpu, &instance), AP_OK);

    assert_int_equal(ap_registry_destroy(registry), AP_ERR_INVALID_ARGUMENT);
    assert_contains(ap_last_error(), "1 instance(s) still open");
    /* The plugin is still mapped: its code answers (16 tokens x 2 KV heads x 64 dims x 2 bytes). */
    ap_kv_spec spec;
    assert_int_equal(ap_instance_kv_spec(instance, &spec), AP_OK);
    assert_int_equal(spec.k_bytes_per_page, 16 * 2 * 64 * 2);
    assert_non_null(ap_registry_find(registry, "good"));

    ap_instance_close(instance);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_fails),
        cmocka_unit_test(test_no_unload_under_live_instance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
