# Single-include amalgamation and the C/C++ compile matrix.
# Included from the Makefile:  include tools/amalgamation.mk
#
#   make amalgamate           regenerate single_include/distsgd.h
#   make check-amalgamation   fail if single_include/distsgd.h is stale
#   make compile-matrix       tests/compile_matrix.sh: gcc/clang C99/C11,
#                             g++/clang++ C++11/C++17, DISTSGD_STATIC, two TUs
#                             on the single include (the repo headers:
#                             DISTSGD_STATIC and two TUs, gcc and g++); every
#                             example built on the single include alone
#                             prints what it prints on the repo headers

PYTHON ?= python3
AMALGAMATE = $(PYTHON) tools/amalgamate.py
SINGLE_INCLUDE = single_include/distsgd.h

.PHONY: amalgamate check-amalgamation compile-matrix

amalgamate:
	$(AMALGAMATE) --out $(SINGLE_INCLUDE)

check-amalgamation:
	@tmp=$$(mktemp "$${TMPDIR:-/tmp}/distsgd-amalg.XXXXXX") || exit 1; \
	$(AMALGAMATE) --out "$$tmp" || { rm -f "$$tmp"; exit 1; }; \
	if [ -f $(SINGLE_INCLUDE) ] && cmp -s "$$tmp" $(SINGLE_INCLUDE); then \
	    rm -f "$$tmp"; echo "$(SINGLE_INCLUDE) is up to date"; \
	else \
	    diff -u $(SINGLE_INCLUDE) "$$tmp" | head -n 40 >&2; rm -f "$$tmp"; \
	    echo "$(SINGLE_INCLUDE) is stale: run 'make amalgamate' and commit it" >&2; \
	    exit 1; \
	fi

compile-matrix:
	bash tests/compile_matrix.sh
