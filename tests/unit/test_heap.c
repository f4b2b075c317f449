/* The heap wrappers' fault injection and the out-of-memory policy. */
#include <criterion/criterion.h>

#include "base/heap.h"

Test(heap, fault_fails_exactly_the_armed_calls)
{
    ida_heap_fault_set(2, 1); /* two succeed, one fails, then all succeed */
    void *a = ida_malloc(8), *b = ida_malloc(8), *c = ida_malloc(8);
    void *d = ida_malloc(8);
    ida_heap_fault_set(0, 0);
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert_null(c);
    cr_assert_not_null(d);
    ida_free(a);
    ida_free(b);
    ida_free(d);
}

Test(heap, oom_check_passes_when_memory_was_had)
{
    IDA_OOM_CHECK(1, "never");
}

Test(heap, oom_ends_the_process_with_its_exit_status, .exit_code = IDA_OOM_EXIT)
{
    IDA_OOM_CHECK(0, "test: a step that cannot be dropped");
    cr_assert_fail("ida_oom() returned");
}
