"""cc_grpc_proto: C++ protobuf + gRPC code from .proto files, offline.

Native proto_library needs @com_google_protobuf (a download), so this runs
Debian's /usr/bin/protoc with /usr/bin/grpc_cpp_plugin in a genrule and wraps
the outputs in a cc_library. Imports are workspace-relative (-I.).
"""

def cc_grpc_proto(name, srcs, deps = [], grpc = True, visibility = None):
    """Generates C++ code for `srcs`; `deps` are other cc_grpc_proto targets."""
    stems = [s[:-len(".proto")] for s in srcs]
    outs = []
    for stem in stems:
        outs += [stem + ".pb.h", stem + ".pb.cc"]
        if grpc:
            outs += [stem + ".grpc.pb.h", stem + ".grpc.pb.cc"]
    pkg = native.package_name()
    full_srcs = [(pkg + "/" + s) if pkg else s for s in srcs]
    grpc_flags = "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin --grpc_out=$(GENDIR) " if grpc else ""
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) " + grpc_flags + " ".join(full_srcs),
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + [d + "_srcs" for d in deps],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpcpp"] if grpc else []),
        visibility = visibility,
    )
