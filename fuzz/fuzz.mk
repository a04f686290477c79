# fuzz.mk - libFuzzer targets (clang only).  `make fuzz` runs this file;
# `make fuzz-run` then calls scripts/run-fuzz.sh.
#
# Each target is linked from only the sources it needs, so a half-written
# module elsewhere in src/ cannot break the fuzz build.  The GGUF reader
# needs the dtype traits table (kernels/dtype.c), which pulls in the
# reference kernels and the SIMD tables chosen at run time.

FUZZ_CC     ?= clang
FUZZ_BUILD  ?= build-fuzz
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -pthread -g -O1 -fno-omit-frame-pointer \
               -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
               -Wall -Wextra -Wshadow -Wmissing-prototypes -Wno-unused-parameter -Werror -Isrc

FUZZ_AVX2   := -mavx2 -mfma -mf16c
FUZZ_AVX512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c

DTYPE_SRC   := src/kernels/dtype.c src/kernels/half.c src/kernels/quant_ref.c src/kernels/quant_avx2.c src/kernels/quant_avx512.c
GGUF_SRC    := src/format/gguf.c src/util/err.c $(DTYPE_SRC)

GGUF_OBJ    := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,fuzz/fuzz_gguf.c $(GGUF_SRC))
TOK_SRC     := $(GGUF_SRC) $(wildcard src/text/tok*.c)
TOK_OBJ     := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,fuzz/fuzz_tokenizer.c $(TOK_SRC))

JINJA_OBJ   := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,fuzz/fuzz_jinja.c $(wildcard src/text/jinja*.c) src/util/err.c)

GRAM_OBJ    := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,fuzz/fuzz_grammar.c src/grammar/gram.c src/grammar/earley.c src/grammar/gbnf.c src/grammar/gnames.c src/grammar/regex.c src/grammar/jschema.c src/grammar/gcache.c src/grammar/tokmask.c src/grammar/tmvocab.c src/grammar/tmshare.c $(filter-out src/util/err.c,$(TOK_SRC)) src/util/err.c)

KVT_OBJ     := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,fuzz/fuzz_kvtier.c src/kv/kvtier.c src/kv/kvidx.c src/kv/kvpend.c src/kv/kvrec.c src/kv/kvhash.c src/util/err.c)

.PHONY: all
all: $(FUZZ_BUILD)/fuzz_gguf $(FUZZ_BUILD)/fuzz_tokenizer $(FUZZ_BUILD)/fuzz_kvtier $(FUZZ_BUILD)/fuzz_jinja $(FUZZ_BUILD)/fuzz_grammar

$(FUZZ_BUILD)/fuzz_grammar: $(GRAM_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lpcre2-8 -ljansson -lm

$(FUZZ_BUILD)/fuzz_jinja: $(JINJA_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -ljansson -lm

$(FUZZ_BUILD)/fuzz_kvtier: $(KVT_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lm

$(FUZZ_BUILD)/fuzz_gguf: $(GGUF_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lm

$(FUZZ_BUILD)/fuzz_tokenizer: $(TOK_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ -lpcre2-8 -lm

$(FUZZ_BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_AVX2) -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_AVX512) -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

-include $(GGUF_OBJ:.o=.d) $(TOK_OBJ:.o=.d) $(KVT_OBJ:.o=.d) $(JINJA_OBJ:.o=.d) $(GRAM_OBJ:.o=.d)
