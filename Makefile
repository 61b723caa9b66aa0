# Front door: installs missing Debian packages, then builds, tests, benchmarks and runs the demo.
# Every target installs what it needs with scripts/install_deps.sh (apt, only when missing).

DEPS := meson ninja-build pkg-config xtensor-dev xtl-dev libxsimd-dev libfmt-dev \
        doctest-dev libopenblas-dev libdnnl-dev ccache g++ python3 gzip zlib1g-dev \
        libopenmpi-dev openmpi-bin libdlpack-dev libbenchmark-dev
DEMO_PACKAGES := dataset-fashion-mnist
BENCH_PACKAGES := libtorch-dev
# tests/test_dlpack_torch.cpp exchanges tensors with libtorch; built only when it is installed.
TEST_PACKAGES := libtorch-dev
# libFuzzer ships in clang's runtime package (libclang_rt.fuzzer-x86_64.a).
FUZZ_PACKAGES := clang libclang-rt-14-dev
FUZZ_SECONDS ?= 30

RELEASE := build/release
RELEASE_OPTIONS := --buildtype=release -Db_ndebug=if-release
# -O1: sanitizer instrumentation at -O2 makes the kernel files several times slower to compile.
# CUDA off: nvcc does not take the sanitizer flags, and the GPU code cannot run here anyway.
SANITIZER_OPTIONS := -Db_lundef=false --buildtype=plain -Doptimization=1 -Ddebug=true -Dcuda=disabled

# The CUDA backend builds when Meson finds nvcc, which it looks for on PATH only: the toolkit's
# usual home counts too, so CUDA code compiles and links wherever the toolkit is installed.
CUDA_BIN := $(wildcard /usr/local/cuda/bin)
ifneq ($(CUDA_BIN),)
export PATH := $(CUDA_BIN):$(PATH)
endif

comma := ,
# $(call configure,BUILD_DIR,SETUP_OPTIONS): `meson setup` once; later builds reconfigure themselves.
configure = test -f $(1)/meson-private/coredata.dat || meson setup $(1) $(2)

.DEFAULT_GOAL := build
.PHONY: build deps test demo bench asan tsan fuzz clean

deps:
	@bash scripts/install_deps.sh $(DEPS)

build: deps
	@$(call configure,$(RELEASE),$(RELEASE_OPTIONS))
	@meson compile -C $(RELEASE)

test: deps
	@bash scripts/install_deps.sh --optional $(TEST_PACKAGES)
	@$(call configure,$(RELEASE),$(RELEASE_OPTIONS))
	@bash scripts/run_tests.sh $(RELEASE) 2

demo: deps
	@bash scripts/install_deps.sh $(DEMO_PACKAGES)
	@$(call configure,$(RELEASE),$(RELEASE_OPTIONS))
	@ninja -C $(RELEASE) examples/demo  # the demo alone; ninja reconfigures first when needed
	@$(RELEASE)/examples/demo

bench: deps
	@bash scripts/install_deps.sh --optional $(BENCH_PACKAGES)
	-@bash benchmarks/peers/setup_tf_venv.sh  # the TensorFlow peer's venv (build/tf-venv); never fatal
	@$(call configure,build/bench,--buildtype=release -Dbenchmarks=enabled -Dtests=false)
	@meson compile -C build/bench
	@bash scripts/run_benchmarks.sh build/bench; status=$$?; \
	  bash tools/flowlet_bench/op_benchmarks.sh build/bench || status=1; exit $$status

asan: deps
	@$(call configure,build/asan,-Db_sanitize=address$(comma)undefined $(SANITIZER_OPTIONS))
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 FLOWLET_TEST_TIME_SCALE=3 \
	  bash scripts/run_tests.sh build/asan 3

tsan: deps
	@$(call configure,build/tsan,-Db_sanitize=thread $(SANITIZER_OPTIONS))
	@TSAN_OPTIONS=second_deadlock_stack=1 FLOWLET_TEST_TIME_SCALE=5 bash scripts/run_tests.sh build/tsan 5

# libFuzzer targets (tests/fuzz) under ASan and UBSan, each run FUZZ_SECONDS on its seed corpus.
# Tests off: the targets need only the library, and clang 14 lacks the std::source_location the
# test helpers use with libstdc++ 12.
fuzz: deps
	@bash scripts/install_deps.sh $(FUZZ_PACKAGES)
	@test -f build/fuzz/meson-private/coredata.dat || CC=clang CXX=clang++ meson setup build/fuzz -Dfuzz=enabled \
	  -Dtests=false -Db_sanitize=address$(comma)undefined $(SANITIZER_OPTIONS)
	@meson compile -C build/fuzz
	@bash scripts/run_fuzzers.sh build/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build
