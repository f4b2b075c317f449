# make deb: Debian packages (idalloc, libidalloc1, libidalloc-dev) built with
# debhelper from debian/, then checked with lintian (errors fail the
# target). Needs debhelper, lintian and fakeroot (apt-get install -y
# debhelper lintian fakeroot); not part of `make test`. The tracked files
# are copied to $(BUILD)/deb/idalloc-VERSION so dpkg-buildpackage writes its
# results into $(BUILD)/deb/, not next to the repository.
.PHONY: deb
deb:
	@for t in dpkg-buildpackage dh lintian fakeroot; do \
	  command -v $$t >/dev/null || { echo "make deb: $$t is missing: apt-get install -y debhelper lintian fakeroot" >&2; exit 1; }; done
	rm -rf $(BUILD)/deb && mkdir -p $(BUILD)/deb/idalloc-$(IDA_VERSION)
	git ls-files -z | xargs -0 tar -cf - | tar -xf - -C $(BUILD)/deb/idalloc-$(IDA_VERSION)
	cd $(BUILD)/deb/idalloc-$(IDA_VERSION) && dpkg-buildpackage -us -uc -b
	lintian --fail-on error $(BUILD)/deb/*.changes
	@ls -1 $(BUILD)/deb/*.deb
