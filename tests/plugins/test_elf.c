/* test_elf.c: damaged plugin files (truncated, another machine, not ELF) are refused before dlopen. */
#include <elf.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_support.h"

typedef struct file_bytes {
    unsigned char *data;
    size_t size;
} file_bytes;

static file_bytes read_whole(const char *path) {
    FILE *stream = fopen(path, "rb");
    if (stream == NULL) fail_msg("cannot open [%s]", path);
    struct stat info;
    assert_int_equal(fstat(fileno(stream), &info), 0);
    file_bytes bytes = {malloc((size_t)info.st_size), (size_t)info.st_size};
    assert_non_null(bytes.data);
    assert_int_equal(fread(bytes.data, 1, bytes.size, stream), bytes.size);
    fclose(stream);
    return bytes;
}

static void write_bytes(const char *path, const void *data, size_t size) {
    FILE *stream = fopen(path, "wb");
    if (stream == NULL) fail_msg("cannot create [%s]", path);
    assert_int_equal(fwrite(data, 1, size, stream), size);
    assert_int_equal(fclose(stream), 0);
}

/* Where the file's last loadable segment ends: the smallest size dlopen may map safely. */
static size_t loadable_end(const file_bytes *bytes) {
    const ElfW(Ehdr) *header = (const ElfW(Ehdr) *)bytes->data;
    size_t end = 0;
    for (unsigned i = 0; i < header->e_phnum; i++) {
        ElfW(Phdr) segment;
        memcpy(&segment, bytes->data + header->e_phoff + i * sizeof segment, sizeof segment);
        if (segment.p_type == PT_LOAD && segment.p_offset + segment.p_filesz > end)
            end = segment.p_offset + segment.p_filesz;
    }
    assert_true(end > 0 && end <= bytes->size);
    return end;
}

static char *make_temp_dir(void) {
    char *dir = strdup("/tmp/ap-test-elf-XXXXXX");
    assert_non_null(dir);
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_dir(char *dir, const char *const *names, size_t count) {
    for (size_t i = 0; i < count; i++) unlink(test_path(dir, names[i]));
    rmdir(dir);
    free(dir);
}

/* A real plugin cut at 5, 25, 50 and 90 percent and one byte short of its last segment: the
 * scan refuses each cut that loses segment bytes (it died of SIGBUS before), naming the size. */
static void check_truncated_copies(const char *source) {
    file_bytes bytes = read_whole(source);
    size_t end = loadable_end(&bytes);
    char *dir = make_temp_dir();
    static const char *const names[] = {"cut_05.so", "cut_25.so", "cut_50.so", "cut_90.so",
                                        "cut_end_minus_1.so"};
    size_t cuts[] = {bytes.size * 5 / 100, bytes.size * 25 / 100, bytes.size * 50 / 100,
                     bytes.size * 90 / 100, end - 1};
    size_t refused = 0;
    for (size_t i = 0; i < 5; i++) {
        if (cuts[i] >= end) continue; /* every segment whole: such a cut is safe to open */
        write_bytes(test_path(dir, names[i]), bytes.data, cuts[i]);
        refused++;
    }
    assert_true(refused >= 2); /* at least 5% and one byte short always lose segment bytes */
    const char *dirs[] = {dir};
    ap_registry *registry = test_registry_scanned(dirs, 1);
    assert_int_equal(ap_registry_file_count(registry), refused);
    assert_int_equal(ap_registry_backend_count(registry), 0);
    for (size_t i = 0; i < 5; i++) {
        if (cuts[i] >= end) continue;
        ap_file_record record = test_record(registry, test_path(dir, names[i]));
        assert_int_equal(record.status, AP_ERR_LOAD);
        char expected[128];
        snprintf(expected, sizeof expected, "truncated: file is %zu bytes", cuts[i]);
        assert_contains(record.message, expected);
    }
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
    /* Cut right after its last segment (no section headers), the file still maps and loads. */
    write_bytes(test_path(dir, "whole_segments.so"), bytes.data, end);
    registry = test_registry(NULL, 0, AP_REGISTRY_NO_DEFAULT_PATHS);
    assert_int_equal(ap_registry_load_file(registry, test_path(dir, "whole_segments.so")), AP_OK);
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
    unlink(test_path(dir, "whole_segments.so"));
    remove_dir(dir, names, 5);
    free(bytes.data);
}

static void test_truncated_fixture(void **state) {
    (void)state;
    check_truncated_copies(test_path(test_dir("AP_TEST_BROKEN_DIR"), "good.so"));
}

/* The reference backend is larger, with most of its bytes in segments. */
static void test_truncated_cpu_ref(void **state) {
    (void)state;
    if (getenv("AP_TEST_EXPECT_BUILD_PLUGIN") == NULL) skip();
    check_truncated_copies(
        test_path(test_dir("AP_TEST_BUILD_ROOT"), "backends/cpu_ref/ap_cpu_ref.so"));
}

/* One header field changed in a copy of a good plugin, and the cause the record must name. */
typedef struct header_patch {
    const char *file;
    size_t offset;
    unsigned value;
    size_t width;
    const char *cause;
} header_patch;

static void test_foreign_headers(void **state) {
    (void)state;
    file_bytes good = read_whole(test_path(test_dir("AP_TEST_BROKEN_DIR"), "good.so"));
    const header_patch patches[] = {
        {"aarch64.so", offsetof(ElfW(Ehdr), e_machine), EM_AARCH64, 2,
         "built for aarch64 (EM_AARCH64), this machine is "},
        {"riscv.so", offsetof(ElfW(Ehdr), e_machine), EM_RISCV, 2, "built for riscv (EM_RISCV)"},
        {"class32.so", EI_CLASS, ELFCLASS32, 1, "a 32-bit ELF file, this machine's plugins are"},
        {"big_endian.so", EI_DATA, ELFDATA2MSB, 1, "other byte order"},
        {"executable.so", offsetof(ElfW(Ehdr), e_type), ET_EXEC, 2,
         "not a shared object (ELF type ET_EXEC"},
    };
    enum { count = sizeof patches / sizeof patches[0] };
    char *dir = make_temp_dir();
    const char *names[count + 3];
    for (size_t i = 0; i < count; i++) {
        unsigned char *copy = malloc(good.size);
        assert_non_null(copy);
        memcpy(copy, good.data, good.size);
        memcpy(copy + patches[i].offset, &patches[i].value, patches[i].width); /* little-endian */
        write_bytes(test_path(dir, patches[i].file), copy, good.size);
        names[i] = patches[i].file;
        free(copy);
    }
    /* Junk: empty, the magic alone, text. */
    write_bytes(test_path(dir, "empty.so"), "", 0);
    write_bytes(test_path(dir, "magic_only.so"), ELFMAG, SELFMAG);
    write_bytes(test_path(dir, "text.so"), "#!/bin/sh\necho not a library\n", 29);
    names[count] = "empty.so", names[count + 1] = "magic_only.so", names[count + 2] = "text.so";
    const char *dirs[] = {dir};
    ap_registry *registry = test_registry_scanned(dirs, 1);
    assert_int_equal(ap_registry_file_count(registry), count + 3);
    for (size_t i = 0; i < count; i++) {
        ap_file_record record = test_record(registry, test_path(dir, patches[i].file));
        assert_int_equal(record.status, AP_ERR_LOAD);
        assert_contains(record.message, patches[i].cause);
        assert_contains(record.message, patches[i].file);
    }
    assert_contains(test_record(registry, test_path(dir, "empty.so")).message,
                    "not an ELF file (0 bytes");
    assert_contains(test_record(registry, test_path(dir, "magic_only.so")).message,
                    "not an ELF file (4 bytes");
    assert_contains(test_record(registry, test_path(dir, "text.so")).message, "not an ELF file");
    assert_int_equal(ap_registry_destroy(registry), AP_OK);
    remove_dir(dir, names, count + 3);
    free(good.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_fixture),
        cmocka_unit_test(test_truncated_cpu_ref),
        cmocka_unit_test(test_foreign_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
