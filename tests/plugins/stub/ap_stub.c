/* ap_stub.c: a library the missing_dep fixture links against, under a soname no file carries. */
__attribute__((visibility("default"))) int ap_stub_answer(void);

__attribute__((visibility("default"))) int ap_stub_answer(void) {
    return 42;
}
