/* Allocation through one door so tests can fail the Nth call (STYLE.md §5).
 *
 * ida_malloc() and friends behave like their libc twins. Tests arm a fault
 * with ida_heap_fault_set(delay, repeat): the next @delay calls succeed, then
 * @repeat calls fail (return NULL), then all succeed again; repeat < 0 means
 * fail forever. The fault state is process-wide and atomic; it is a test hook
 * and disarmed by default (ida_heap_fault_set(0, 0)). */
#ifndef IDA_HEAP_H
#define IDA_HEAP_H

#include <stddef.h>

void *ida_malloc(size_t size);
void *ida_calloc(size_t count, size_t size);
void *ida_realloc(void *ptr, size_t size);
void ida_free(void *ptr);
/* Duplicate @len bytes of @src plus a terminating NUL. */
char *ida_strndup(const char *src, size_t len);

void ida_heap_fault_set(int delay, int repeat);

#endif /* IDA_HEAP_H */
