/* storage/: one open of a directory per process (LMDB's locks are per
 * process: a second open of the same environment in one process would
 * break them). */
#include "storage/storage.h"

#include <pthread.h>
#include <sys/types.h>

#include "idalloc_errors.h"
#include "storage/internal.h"

#define REGISTRY_MAX 64
static struct
{
    dev_t dev;
    ino_t ino;
    int used;
} registry[REGISTRY_MAX];
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

int ida__storage_registry_claim(dev_t dev, ino_t ino)
{
    int rv = IDA_EEXIST;
    int free_slot = -1;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < REGISTRY_MAX; i++) {
        if (registry[i].used && registry[i].dev == dev &&
            registry[i].ino == ino) {
            goto out;
        }
        if (!registry[i].used && free_slot < 0) {
            free_slot = i;
        }
    }
    if (free_slot < 0) {
        rv = IDA_ENOMEM;
        goto out;
    }
    registry[free_slot].dev = dev;
    registry[free_slot].ino = ino;
    registry[free_slot].used = 1;
    rv = 0;
out:
    pthread_mutex_unlock(&registry_lock);
    return rv;
}

void ida__storage_registry_release(dev_t dev, ino_t ino)
{
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < REGISTRY_MAX; i++) {
        if (registry[i].used && registry[i].dev == dev &&
            registry[i].ino == ino) {
            registry[i].used = 0;
        }
    }
    pthread_mutex_unlock(&registry_lock);
}
