"""shardopt_fuzzer: one libFuzzer target and the test that replays its seeds.

`NAME` is the fuzz target: under `--config=fuzz` (clang, libFuzzer,
AddressSanitizer + UBSan) libFuzzer provides its main; in the normal build
replay_main.cc does, so every fuzzer is compiled by every build. `NAME_seeds_test`
runs the target (normal build) on its committed corpus, corpus/NAME/.
"""

def shardopt_fuzzer(name, srcs, deps):
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        linkopts = select({
            "//tools/fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//tools/fuzz:fuzzing": [],
            "//conditions:default": ["//tools/fuzz:replay_main"],
        }),
    )
    native.sh_test(
        name = name + "_seeds_test",
        size = "small",
        srcs = ["replay_seeds_test.sh"],
        args = [
            "$(location :%s)" % name,
            "tools/fuzz/corpus/" + name,
        ],
        data = [":" + name] + native.glob(["corpus/%s/*" % name]),
    )
