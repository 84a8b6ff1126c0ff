/* load_elf.c: check that a plugin file is a whole ELF shared object for this machine before dlopen. */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* What this build's own objects are: a plugin must match to be mapped into this process. */
#if defined(__x86_64__)
#define AP_ELF_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define AP_ELF_MACHINE EM_AARCH64
#elif defined(__i386__)
#define AP_ELF_MACHINE EM_386
#elif defined(__arm__)
#define AP_ELF_MACHINE EM_ARM
#elif defined(__riscv)
#define AP_ELF_MACHINE EM_RISCV
#elif defined(__powerpc64__)
#define AP_ELF_MACHINE EM_PPC64
#elif defined(__s390x__)
#define AP_ELF_MACHINE EM_S390
#else
#define AP_ELF_MACHINE EM_NONE /* unknown here: dlopen alone judges the machine */
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define AP_ELF_DATA ELFDATA2LSB
#else
#define AP_ELF_DATA ELFDATA2MSB
#endif

#if __SIZEOF_POINTER__ == 8
#define AP_ELF_CLASS ELFCLASS64
#else
#define AP_ELF_CLASS ELFCLASS32
#endif

static const struct {
    unsigned machine;
    const char *name, *macro;
} ap_elf_machines[] = {
    {EM_X86_64, "x86-64", "EM_X86_64"}, {EM_AARCH64, "aarch64", "EM_AARCH64"},
    {EM_386, "i386", "EM_386"},         {EM_ARM, "arm", "EM_ARM"},
    {EM_RISCV, "riscv", "EM_RISCV"},    {EM_PPC64, "ppc64", "EM_PPC64"},
    {EM_PPC, "ppc", "EM_PPC"},          {EM_S390, "s390", "EM_S390"},
};

/* "aarch64 (EM_AARCH64)", or "machine 1234" for one not in the table. */
static void ap_elf_machine_name(unsigned machine, char *text, size_t size) {
    for (size_t i = 0; i < sizeof ap_elf_machines / sizeof ap_elf_machines[0]; i++) {
        if (ap_elf_machines[i].machine == machine) {
            snprintf(text, size, "%s (%s)", ap_elf_machines[i].name, ap_elf_machines[i].macro);
            return;
        }
    }
    snprintf(text, size, "ELF machine %u", machine);
}

static int ap_elf_read(int fd, void *buffer, size_t bytes, off_t offset) {
    ssize_t n = pread(fd, buffer, bytes, offset);
    return n >= 0 && (size_t)n == bytes;
}

/* The identification bytes and the header fields that say what the file was built for. */
static ap_status ap_elf_check_header(const ElfW(Ehdr) * header, long long size, char *why,
                                     size_t why_size) {
    const unsigned char *ident = header->e_ident;
    if (ident[EI_CLASS] != AP_ELF_CLASS) {
        snprintf(why, why_size, "a %s ELF file, this machine's plugins are %d-bit",
                 ident[EI_CLASS] == ELFCLASS32   ? "32-bit"
                 : ident[EI_CLASS] == ELFCLASS64 ? "64-bit"
                                                 : "malformed (bad EI_CLASS)",
                 AP_ELF_CLASS == ELFCLASS64 ? 64 : 32);
        return AP_ERR_LOAD;
    }
    if (ident[EI_DATA] != AP_ELF_DATA) {
        snprintf(why, why_size, "an ELF file of the other byte order (EI_DATA %u)",
                 (unsigned)ident[EI_DATA]);
        return AP_ERR_LOAD;
    }
    if (AP_ELF_MACHINE != EM_NONE && header->e_machine != AP_ELF_MACHINE) {
        char theirs[64], ours[64];
        ap_elf_machine_name(header->e_machine, theirs, sizeof theirs);
        ap_elf_machine_name(AP_ELF_MACHINE, ours, sizeof ours);
        snprintf(why, why_size, "built for %s, this machine is %s", theirs, ours);
        return AP_ERR_LOAD;
    }
    if (header->e_type != ET_DYN) {
        snprintf(why, why_size, "not a shared object (ELF type %s)",
                 header->e_type == ET_EXEC  ? "ET_EXEC, an executable"
                 : header->e_type == ET_REL ? "ET_REL, an object file"
                                            : "other than ET_DYN");
        return AP_ERR_LOAD;
    }
    if (header->e_phnum == 0 || header->e_phentsize != sizeof(ElfW(Phdr))) {
        snprintf(why, why_size, "malformed ELF: %u program headers of %u bytes",
                 (unsigned)header->e_phnum, (unsigned)header->e_phentsize);
        return AP_ERR_LOAD;
    }
    unsigned long long table_end = (unsigned long long)header->e_phoff +
                                   (unsigned long long)header->e_phnum * sizeof(ElfW(Phdr));
    if (table_end > (unsigned long long)size) {
        snprintf(why, why_size, "truncated: file is %lld bytes, its program headers end at %llu",
                 size, table_end);
        return AP_ERR_LOAD;
    }
    return AP_OK;
}

/* Every PT_LOAD segment's bytes must lie in the file: dlopen maps them, and touching a page
 * past the end of a file raises SIGBUS in whoever touches it. */
static ap_status ap_elf_check_segments(int fd, const ElfW(Ehdr) * header, long long size, char *why,
                                       size_t why_size) {
    for (unsigned i = 0; i < header->e_phnum; i++) {
        ElfW(Phdr) segment;
        if (!ap_elf_read(fd, &segment, sizeof segment,
                         (off_t)(header->e_phoff + (ElfW(Off))i * sizeof segment))) {
            snprintf(why, why_size, "cannot read program header %u: %s", i,
                     errno != 0 ? strerror(errno) : "short read");
            return AP_ERR_LOAD;
        }
        if (segment.p_type != PT_LOAD) continue;
        unsigned long long end =
            (unsigned long long)segment.p_offset + (unsigned long long)segment.p_filesz;
        if (end < segment.p_offset || end > (unsigned long long)size) {
            snprintf(why, why_size, "truncated: file is %lld bytes, segment %u needs %llu", size, i,
                     end);
            return AP_ERR_LOAD;
        }
    }
    return AP_OK;
}

ap_status ap_elf_check(const char *path, char *why, size_t why_size) {
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, why_size, "%s", strerror(errno));
        return AP_ERR_LOAD;
    }
    ap_status status = AP_ERR_LOAD;
    struct stat info;
    ElfW(Ehdr) header;
    errno = 0;
    if (fstat(fd, &info) != 0) {
        snprintf(why, why_size, "%s", strerror(errno));
    } else if (!S_ISREG(info.st_mode)) {
        snprintf(why, why_size, "not a regular file");
    } else if (!ap_elf_read(fd, &header, sizeof header, 0) ||
               memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
        snprintf(why, why_size, "not an ELF file (%lld bytes, no ELF header)",
                 (long long)info.st_size);
    } else {
        status = ap_elf_check_header(&header, (long long)info.st_size, why, why_size);
        if (status == AP_OK)
            status = ap_elf_check_segments(fd, &header, (long long)info.st_size, why, why_size);
    }
    close(fd);
    return status;
}
