/* Lets Criterion start under ThreadSanitizer in the client library's tests
 * (make tsan runs test_client and test_async): the same rand_r()
 * interposition as the pool's tests, which explains it. Empty in other
 * builds. */
#include "tests/pool/tsan_criterion_fix.c"
