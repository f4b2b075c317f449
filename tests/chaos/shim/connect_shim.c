/* The chaos suite's connect() shim, preloaded (LD_PRELOAD) into the chaos
 * run's idallocd processes only. IDA_CHAOS_CONNECT="A=B,C=D,..." sends a
 * connect() to 127.0.0.1:A to 127.0.0.1:B instead: the run maps every other
 * node's real peer port to the fault proxy's port for the link from this
 * node (tests/chaos/proxy.h). So the nodes, their cluster file and the
 * membership (which carries every member's addresses, checked against
 * where the node says it listens) all name the real addresses, and yet
 * every peer link goes through the proxy. Anything else connects as asked.
 *
 * Not part of libida or the programs: mk/chaos.mk builds it as
 * $(BUILD)/lib/ida_chaos_shim.so. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAP_MAX 16

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static connect_fn real_connect;
static uint16_t from_port[MAP_MAX], to_port[MAP_MAX];
static int n_map;

/* Read the map once, before any thread of the node starts. */
__attribute__((constructor)) static void shim_init(void)
{
    real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    const char *s = getenv("IDA_CHAOS_CONNECT");
    while (s != NULL && *s != '\0' && n_map < MAP_MAX) {
        char *end;
        unsigned long a = strtoul(s, &end, 10);
        if (*end != '=') {
            break;
        }
        unsigned long b = strtoul(end + 1, &end, 10);
        if (a == 0 || a > 65535 || b == 0 || b > 65535) {
            break;
        }
        from_port[n_map] = (uint16_t)a;
        to_port[n_map++] = (uint16_t)b;
        s = *end == ',' ? end + 1 : NULL;
    }
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    if (addr != NULL && addr->sa_family == AF_INET &&
        len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, addr, sizeof(in));
        for (int i = 0; i < n_map; i++) {
            if (in.sin_addr.s_addr == htonl(INADDR_LOOPBACK) &&
                ntohs(in.sin_port) == from_port[i]) {
                in.sin_port = htons(to_port[i]);
                return real_connect(fd, (const struct sockaddr *)&in,
                                    sizeof(in));
            }
        }
    }
    return real_connect(fd, addr, len);
}
