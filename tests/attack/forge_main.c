/* build/prog/forge: hold many hostile connections from a process of its
 * own (a test process has too few descriptors for 20,000 of them).
 *
 *   forge idle ADDR COUNT           connect COUNT times, send nothing
 *   forge header ADDR COUNT LEN     connect COUNT times, send a client frame
 *                                   header announcing LEN bytes, then nothing
 *
 * Prints "forge: N open" once the connections are made (N may be less than
 * COUNT: refused or failed connects are not retried), then waits for
 * SIGTERM/SIGKILL; on stdin's EOF it exits too, so it dies with its test.
 * Connects only where it is told (tests use 127.0.0.1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/lib/forge.h"

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "idle") != 0 &&
                     !(strcmp(argv[1], "header") == 0 && argc == 5))) {
        fprintf(stderr,
                "usage: forge idle ADDR COUNT | forge header ADDR COUNT "
                "LEN\n");
        return 2;
    }
    int count = atoi(argv[3]);
    if (count <= 0) {
        fprintf(stderr, "forge: bad COUNT %s\n", argv[3]);
        return 2;
    }
    forge_raise_nofile();
    int *fds = calloc((size_t)count, sizeof(int));
    int open = 0;
    /* In batches: a burst of thousands of SYNs overflows the listen
     * backlog and costs retransmission seconds. */
    while (open < count) {
        int want = count - open < 500 ? count - open : 500;
        int got = forge_open_many(argv[2], want, fds + open, 10000);
        open += got;
        if (got == 0) {
            break;
        }
    }
    if (strcmp(argv[1], "header") == 0) {
        uint8_t h[6];
        forge_header(h, 1, (uint32_t)strtoul(argv[4], NULL, 10));
        for (int i = 0; i < open; i++) {
            forge_send(fds[i], h, sizeof(h));
        }
    }
    printf("forge: %d open\n", open);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
