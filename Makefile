# meshtrain: convenience targets around CMake. See README.md.
#   make build    configure + build into build/ (Release)
#   make test     install-deps, build, corpus (the bf16 training test trains on it), run the
#                 test suite with ctest
#   make corpus   build data/kjv (skipped when up to date)
#   make demo     install-deps, build, corpus, train configs/demo.yml, sample from it
#                 (DEMO_ARGS="steps=40": key=value overrides for the demo's train)
#   make clean    remove build/;  make distclean  also remove data/kjv

BUILD_DIR ?= build
NPROC     := $(shell nproc 2>/dev/null || echo 2)
MESHTRAIN := $(BUILD_DIR)/meshtrain
CORPUS    := data/kjv
# Must match base_output_directory/run_name in configs/demo.yml.
DEMO_RUN  := out/demo
# key=value overrides for the demo's `train`, e.g. make demo DEMO_ARGS="steps=40" (not run_name or
# base_output_directory: sample reads the newest checkpoint under $(DEMO_RUN))
DEMO_ARGS ?=

.PHONY: all deps hf-venv build test corpus demo clean distclean
# Targets run in the order written (install before build); cmake parallelises.
.NOTPARALLEL:

all: build

deps:
	scripts/install-deps.sh

build:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release
	@# MAKEFLAGS cleared, and --no-print-directory for cmake's own make: run from this
	@# make it is a sub-make (MAKELEVEL > 0), which GNU make has print every directory change.
	MAKEFLAGS= cmake --build $(BUILD_DIR) -j$(NPROC) -- --no-print-directory

# The transformers parity test needs a PyPI torch 2 + transformers venv (.venv-hf,
# ~3.5 GB download the first time, then cached): scripts/setup-hf-venv.sh; the Gemma 4
# tests add transformers 5.17 over it (.venv-hf5-overlay, ~200 MB, no second torch):
# scripts/setup-hf5-overlay.sh.
hf-venv:
	scripts/setup-hf-venv.sh
	scripts/setup-hf5-overlay.sh

test: deps build hf-venv corpus
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j2

# Up to date when the stamp (written last) is newer than the scripts that made it
# and all four files exist.
CORPUS_FILES := train_000.bin val_000.bin tokenizer.model tokenizer.vocab
corpus:
	@ok=1; for f in $(CORPUS_FILES); do [ -f $(CORPUS)/$$f ] || ok=0; done; \
	for s in scripts/prepare_corpus.sh scripts/kjv_corpus.py; do \
	    [ $(CORPUS)/.stamp -nt $$s ] || ok=0; done; \
	if [ $$ok = 1 ]; then echo "corpus: $(CORPUS) is up to date"; \
	else rm -f $(CORPUS)/.stamp && scripts/prepare_corpus.sh $(CORPUS) && touch $(CORPUS)/.stamp; fi

# A fresh run each time: the previous demo output is removed first, once the config with
# DEMO_ARGS is known to be good (`plan` checks every key and value, exit 2 naming a bad
# one), so a typo in DEMO_ARGS does not cost the previous run.
demo: deps build corpus
	@case " $(DEMO_ARGS) " in *" run_name="*|*" base_output_directory="*) \
	  echo "make demo: DEMO_ARGS may not set run_name or base_output_directory (the demo writes, and first removes, $(DEMO_RUN)); use meshtrain train for another run" >&2; \
	  exit 2;; esac
	$(MESHTRAIN) plan configs/demo.yml $(DEMO_ARGS) > /dev/null
	rm -rf $(DEMO_RUN)
	$(MESHTRAIN) train configs/demo.yml $(DEMO_ARGS)
	@# only complete checkpoints (step_<digits>), never a step_N.tmp left by a crash
	ckpt=$$(ls -d $(DEMO_RUN)/checkpoints/step_* | grep -E '/step_[0-9]+$$' | sort -V | tail -n 1) && \
	$(MESHTRAIN) sample configs/demo.yml load_checkpoint=$$ckpt

clean:
	rm -rf $(BUILD_DIR)

distclean: clean
	rm -rf $(CORPUS)
