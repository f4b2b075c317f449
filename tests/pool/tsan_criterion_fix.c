/* Lets Criterion start under ThreadSanitizer (tests/pool only, TSan builds
 * only).
 *
 * Criterion's sandbox (BoxFort, src/arena.c) maps its shared arena at
 * 0x200000000000 + (rand_r() & 0x3fffff) * 16 MiB with MAP_FIXED. Under TSan
 * almost all of that range is shadow or forbidden memory, so the mapping
 * fails and every test binary aborts with "Could not initialize inheritable
 * arena: Resource temporarily unavailable" (Snaipe/Criterion issue #274,
 * open). This definition of rand_r() interposes libc's for the test binary
 * and steers BoxFort into TSan's application range 0x560000000000-
 * 0x568000000000 (BoxFort skips a base that is already mapped and draws
 * again, so successive values step 256 MiB apart). Nothing else in these
 * binaries uses rand_r(). Built only when gcc or clang compile with
 * -fsanitize=thread; other builds keep libc's rand_r(). */
#include <stdlib.h>

#if defined(__SANITIZE_THREAD__)
#define IDA_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IDA_TSAN_BUILD 1
#endif
#endif

#ifdef IDA_TSAN_BUILD
int rand_r(unsigned int *seed)
{
    unsigned int step = (*seed)++ & 0x7f;
    return (int)(0x360000u + step * 16u);
}
#else
/* ISO C forbids an empty translation unit. */
typedef int ida_tsan_criterion_fix_unused;
#endif
