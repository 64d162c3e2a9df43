"""Build macros shared by every package.

agentix_proto_library wraps the system protoc (Debian's protobuf-compiler and
protobuf-compiler-grpc) once, so no package hand-writes codegen genrules.
"""

_PROTOC = "/usr/bin/protoc"
_GRPC_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"
_GRPC_PYTHON_PLUGIN = "/usr/bin/grpc_python_plugin"

def agentix_proto_library(name, srcs, grpc = True, visibility = None):
    """Generates C++ and Python code for `srcs` (paths relative to //proto).

    Emits:
      <name>_cc_proto: cc_library with the messages only (links libprotobuf,
                       not gRPC); include as "agentix/<area>/v1/<file>.pb.h".
      <name>_cc_grpc:  cc_library with the services (when grpc=True), on top
                       of <name>_cc_proto; include as ".grpc.pb.h". Only code
                       that serves or calls the RPCs depends on it.
      <name>_py:       filegroup with <file>_pb2.py (and <file>_pb2_grpc.py).

    Must be called from the //proto package: import paths are relative to it.
    """
    cc_outs = []
    py_outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        cc_outs += [base + ".pb.h", base + ".pb.cc"]
        py_outs += [base + "_pb2.py"]
        if grpc:
            cc_outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
            py_outs += [base + "_pb2_grpc.py"]

    grpc_cpp = ""
    grpc_py = ""
    if grpc:
        grpc_cpp = "--grpc_out=$(GENDIR)/proto --plugin=protoc-gen-grpc=%s" % _GRPC_CPP_PLUGIN
        grpc_py = "--grpc_python_out=$(GENDIR)/proto --plugin=protoc-gen-grpc_python=%s" % _GRPC_PYTHON_PLUGIN

    native.genrule(
        name = name + "_cc_gen",
        srcs = srcs,
        outs = cc_outs,
        cmd = "%s -Iproto --cpp_out=$(GENDIR)/proto %s $(SRCS)" % (_PROTOC, grpc_cpp),
    )
    native.genrule(
        name = name + "_py_gen",
        srcs = srcs,
        outs = py_outs,
        cmd = "%s -Iproto --python_out=$(GENDIR)/proto %s $(SRCS)" % (_PROTOC, grpc_py),
    )
    services = [o for o in cc_outs if ".grpc.pb." in o]
    messages = [o for o in cc_outs if ".grpc.pb." not in o]
    native.cc_library(
        name = name + "_cc_proto",
        srcs = [o for o in messages if o.endswith(".cc")],
        hdrs = [o for o in messages if o.endswith(".h")],
        includes = ["."],
        deps = ["//third_party/system:protobuf"],
        visibility = visibility,
    )
    if grpc:
        native.cc_library(
            name = name + "_cc_grpc",
            srcs = [o for o in services if o.endswith(".cc")],
            hdrs = [o for o in services if o.endswith(".h")],
            includes = ["."],
            deps = [
                ":" + name + "_cc_proto",
                "//third_party/system:grpc",
            ],
            visibility = visibility,
        )
    native.filegroup(
        name = name + "_py",
        srcs = py_outs,
        visibility = visibility,
    )
