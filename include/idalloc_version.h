/* The one version number of idalloc: the daemon, the CLI and the client
 * library all report it (`idallocd --version`, `idalloc --version`,
 * idalloc_version()). Change it here only. */
#ifndef IDALLOC_VERSION_H
#define IDALLOC_VERSION_H

#define IDALLOC_VERSION "0.2.0"

#endif /* IDALLOC_VERSION_H */
