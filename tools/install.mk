# tools/install.mk - `make install`, `make uninstall` and `make test-consumers`
# for distsgd (GNU make). Included by the Makefile; also works alone:
#   make -f tools/install.mk install PREFIX=$HOME/.local
#
#   make install   [PREFIX=/usr/local] [DESTDIR=] installs
#                    $(INCLUDEDIR)/distsgd.h, $(INCLUDEDIR)/distsgd_cl.h
#                    $(INCLUDEDIR)/distsgd/single/distsgd.h  (the amalgamation,
#                        single_include/distsgd.h, when it exists; include it as
#                        <distsgd/single/distsgd.h>)
#                    $(PKGCONFIGDIR)/distsgd.pc, $(PKGCONFIGDIR)/distsgd-opencl.pc
#                  under $(DESTDIR). The .pc files are generated from
#                  tools/*.pc.in with the version of DISTSGD_VERSION_STRING in
#                  distsgd.h and prefix=$(PREFIX) (DESTDIR is not written in them).
#   make uninstall (same PREFIX/DESTDIR) removes exactly those files, and the
#                  include/distsgd/single and include/distsgd folders if empty.
#   make test-consumers  runs tests/consumers.sh: pkg-config and CMake consumers
#                  built against a DESTDIR install and the CMakeLists.txt.
#
# INCLUDEDIR (default $(PREFIX)/include) and PKGCONFIGDIR (default
# $(PREFIX)/lib/pkgconfig) may be set too.

# Repository root: the folder above this file, wherever make runs from.
DSGD_ROOT := $(patsubst %/,%,$(dir $(abspath $(dir $(lastword $(MAKEFILE_LIST))))))

PREFIX ?= /usr/local
DESTDIR ?=
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(PREFIX)/lib/pkgconfig
INSTALL ?= install

DSGD_VERSION = $(shell sed -n 's/^\#define DISTSGD_VERSION_STRING "\(.*\)".*/\1/p' $(DSGD_ROOT)/distsgd.h)
# includedir as written in the .pc files: relative to ${prefix} when under it.
DSGD_PC_INCLUDEDIR = $(if $(filter $(PREFIX)/%,$(INCLUDEDIR)),$${prefix}/$(patsubst $(PREFIX)/%,%,$(INCLUDEDIR)),$(INCLUDEDIR))
DSGD_PC_SED = -e 's|@prefix@|$(PREFIX)|g' -e 's|@includedir@|$(DSGD_PC_INCLUDEDIR)|g' \
    -e 's|@version@|$(DSGD_VERSION)|g'

DSGD_INSTALL_HEADERS := distsgd.h distsgd_cl.h
# the parts the maps include, installed beside them as distsgd/ and distsgd/cl/
DSGD_INSTALL_PARTS := $(patsubst $(DSGD_ROOT)/%,%,$(wildcard $(DSGD_ROOT)/distsgd/*.h))
DSGD_INSTALL_CL_PARTS := $(patsubst $(DSGD_ROOT)/%,%,$(wildcard $(DSGD_ROOT)/distsgd/cl/*.h))
DSGD_INSTALL_PCS := distsgd.pc distsgd-opencl.pc
DSGD_SINGLE_DIR = $(INCLUDEDIR)/distsgd/single

.PHONY: install uninstall test-consumers

install:
	@test -n "$(DSGD_VERSION)" || { echo "install.mk: no DISTSGD_VERSION_STRING in $(DSGD_ROOT)/distsgd.h" >&2; exit 1; }
	$(INSTALL) -d '$(DESTDIR)$(INCLUDEDIR)' '$(DESTDIR)$(PKGCONFIGDIR)'
	$(INSTALL) -m 644 $(addprefix $(DSGD_ROOT)/,$(DSGD_INSTALL_HEADERS)) '$(DESTDIR)$(INCLUDEDIR)/'
	$(INSTALL) -d '$(DESTDIR)$(INCLUDEDIR)/distsgd/cl'
	$(INSTALL) -m 644 $(addprefix $(DSGD_ROOT)/,$(DSGD_INSTALL_PARTS)) '$(DESTDIR)$(INCLUDEDIR)/distsgd/'
	$(INSTALL) -m 644 $(addprefix $(DSGD_ROOT)/,$(DSGD_INSTALL_CL_PARTS)) '$(DESTDIR)$(INCLUDEDIR)/distsgd/cl/'
	@if [ -f '$(DSGD_ROOT)/single_include/distsgd.h' ]; then \
	    echo "$(INSTALL) -d '$(DESTDIR)$(DSGD_SINGLE_DIR)'"; \
	    $(INSTALL) -d '$(DESTDIR)$(DSGD_SINGLE_DIR)' && \
	    echo "$(INSTALL) -m 644 single_include/distsgd.h '$(DESTDIR)$(DSGD_SINGLE_DIR)/distsgd.h'" && \
	    $(INSTALL) -m 644 '$(DSGD_ROOT)/single_include/distsgd.h' '$(DESTDIR)$(DSGD_SINGLE_DIR)/distsgd.h'; \
	fi
	@set -e; for pc in $(DSGD_INSTALL_PCS); do \
	    echo "generate $(DESTDIR)$(PKGCONFIGDIR)/$$pc (version $(DSGD_VERSION))"; \
	    sed $(DSGD_PC_SED) '$(DSGD_ROOT)/tools/'$$pc.in > '$(DESTDIR)$(PKGCONFIGDIR)/'$$pc.tmp; \
	    chmod 644 '$(DESTDIR)$(PKGCONFIGDIR)/'$$pc.tmp; \
	    mv '$(DESTDIR)$(PKGCONFIGDIR)/'$$pc.tmp '$(DESTDIR)$(PKGCONFIGDIR)/'$$pc; \
	done

uninstall:
	rm -f $(foreach h,$(DSGD_INSTALL_HEADERS) $(DSGD_INSTALL_PARTS) $(DSGD_INSTALL_CL_PARTS),'$(DESTDIR)$(INCLUDEDIR)/$h') \
	    '$(DESTDIR)$(DSGD_SINGLE_DIR)/distsgd.h' \
	    $(foreach p,$(DSGD_INSTALL_PCS),'$(DESTDIR)$(PKGCONFIGDIR)/$p')
	-@rmdir '$(DESTDIR)$(DSGD_SINGLE_DIR)' 2>/dev/null || true
	-@rmdir '$(DESTDIR)$(INCLUDEDIR)/distsgd/cl' 2>/dev/null || true
	-@rmdir '$(DESTDIR)$(INCLUDEDIR)/distsgd' 2>/dev/null || true

test-consumers:
	bash $(DSGD_ROOT)/tests/consumers.sh
