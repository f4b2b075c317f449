# make install / make uninstall (README.md, "Install").
#
#   make install [PREFIX=/usr/local] [DESTDIR=]
#
# installs the programs, the client library (static, shared with its SONAME
# and links), the public headers, idalloc.pc, the man pages, the systemd unit
# idallocd@.service and an example cluster file under $(DESTDIR)$(PREFIX).
# `make uninstall` with the same PREFIX and DESTDIR removes exactly those
# files. Nothing is built as root: run `make programs` first if needed.
PREFIX ?= /usr/local
DESTDIR ?=
I_BIN = $(DESTDIR)$(PREFIX)/bin
I_LIB = $(DESTDIR)$(PREFIX)/lib
I_INC = $(DESTDIR)$(PREFIX)/include
I_PC = $(I_LIB)/pkgconfig
I_MAN = $(DESTDIR)$(PREFIX)/share/man
I_UNIT = $(DESTDIR)$(PREFIX)/lib/systemd/system
I_DOC = $(DESTDIR)$(PREFIX)/share/doc/idalloc
MANPAGES := man/idalloc.1 man/libidalloc.3 man/idalloc.conf.5 man/idallocd.8
PUBLIC_HEADERS := $(wildcard include/idalloc*.h)

.PHONY: install uninstall
install: build-programs
	install -d $(I_BIN) $(I_LIB) $(I_INC) $(I_PC) $(I_UNIT) $(I_DOC)/examples
	install -m 755 $(BINDIR)/idallocd $(BINDIR)/idalloc $(I_BIN)/
	install -m 644 $(LIBDIR)/libidalloc.a $(I_LIB)/
	install -m 755 $(LIBSO_REAL) $(I_LIB)/
	ln -sf libidalloc.so.$(IDA_VERSION) $(I_LIB)/libidalloc.so.$(SOVERSION)
	ln -sf libidalloc.so.$(SOVERSION) $(I_LIB)/libidalloc.so
	install -m 644 $(PUBLIC_HEADERS) $(I_INC)/
	sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(PREFIX)/lib|' \
	    -e 's|@INCLUDEDIR@|$(PREFIX)/include|; s|@VERSION@|$(IDA_VERSION)|' \
	    dist/idalloc.pc.in > $(I_PC)/idalloc.pc
	chmod 644 $(I_PC)/idalloc.pc
	for m in $(MANPAGES); do s=$${m##*.}; install -d $(I_MAN)/man$$s; \
	    gzip -9n < $$m > $(I_MAN)/man$$s/$$(basename $$m).gz; done
	sed 's|@BINDIR@|$(PREFIX)/bin|' dist/idallocd@.service \
	    > $(I_UNIT)/idallocd@.service
	chmod 644 $(I_UNIT)/idallocd@.service
	install -m 644 dist/cluster.conf.example $(I_DOC)/examples/cluster.conf

uninstall:
	rm -f $(I_BIN)/idallocd $(I_BIN)/idalloc
	rm -f $(I_LIB)/libidalloc.a $(I_LIB)/libidalloc.so \
	    $(I_LIB)/libidalloc.so.$(SOVERSION) $(I_LIB)/libidalloc.so.$(IDA_VERSION)
	rm -f $(addprefix $(I_INC)/,$(notdir $(PUBLIC_HEADERS)))
	rm -f $(I_PC)/idalloc.pc $(I_UNIT)/idallocd@.service
	for m in $(MANPAGES); do s=$${m##*.}; \
	    rm -f $(I_MAN)/man$$s/$$(basename $$m).gz; done
	rm -f $(I_DOC)/examples/cluster.conf
	-rmdir $(I_DOC)/examples $(I_DOC) 2>/dev/null || true
