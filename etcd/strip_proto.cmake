# cmake -DIN=<etcd .proto> -DOUT=<copy> -P strip_proto.cmake
#
# Copies one of etcd's .proto files without what only its Go code generator reads: the imports of
# gogoproto/gogo.proto and google/api/annotations.proto, the file options (gogoproto.*) and the
# grpc-gateway's per-method options (google.api.http). Packages, messages, field numbers and
# services stay as they are, so the stubs protoc makes from the copy speak etcd's wire format.
# Fails, naming the file, when a gogoproto or google.api reference is left (a newer etcd that
# uses them in a form this script does not strip, such as a field option).
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "strip_proto.cmake: usage: cmake -DIN=<file.proto> -DOUT=<copy> -P strip_proto.cmake")
endif()
file(READ "${IN}" text)
string(REGEX REPLACE "import \"(gogoproto/gogo|google/api/annotations)\\.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[A-Za-z_]+\\) = [A-Za-z_]+;" "" text "${text}")
# option (google.api.http) = { post: "/v3/kv/range" body: "*" additional_bindings { ... } };
# (braces nest one level deep at most)
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]*{[^{}]*})*[^{}]*};" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api|google/api")
  message(FATAL_ERROR "strip_proto.cmake: ${IN} still refers to gogoproto or google.api after "
                      "stripping; etcd/strip_proto.cmake needs to learn the new form")
endif()
file(WRITE "${OUT}" "// Generated from ${IN} by etcd/strip_proto.cmake: Go-only options removed.\n${text}")
