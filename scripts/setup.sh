#!/usr/bin/env bash
# Installs the Debian 12 packages leasehold builds and tests with. Idempotent: it installs
# only what is missing, says what that is, and never prompts.
set -euo pipefail

packages=(
  build-essential cmake pkg-config g++          # toolchain (C++20 on g++ 12)
  liburing-dev                                  # io_uring event loop
  libboost-dev                                  # Boost.Interprocess (shm table)
  libjemalloc-dev                               # allocator for the daemons
  libbenchmark-dev libgtest-dev                 # perf/ and tests/
  libsqlite3-dev                                # lockd's embedded store
  libssl-dev                                    # HMAC-SHA256 (libcrypto)
  libcli11-dev                                  # command lines
  nlohmann-json3-dev                            # JSON output and the supervisor control socket
  libcpp-httplib-dev                            # the daemons' /metrics and /healthz endpoint
  clang libclang-rt-14-dev                      # libFuzzer
  spin                                          # model checker for specs/
  rt-tests                                      # cyclictest (perf baseline)
  bubblewrap                                    # optional sandbox wrapping
  libseccomp-dev                                # the isolated sandbox's system-call filter
  libsystemd-dev                                # Type=notify units: the watchdog interval (sd_watchdog_enabled)
  iproute2                                      # network namespaces for the demo
  nftables                                      # the demo's loopback fallback cuts a worker off with nft
  python3                                       # specs/check drives Spin
  python3-prometheus-client                     # tests parse /metrics with the Prometheus client parser
  gnuplot-nox                                   # pause-probe plots
  etcd-server                                   # the replicated store of lockd clusters (tests run a real one)
  golang-etcd-server-dev                        # etcd's .proto files, compiled at build time
  libgrpc++-dev protobuf-compiler-grpc          # gRPC: etcd's API (grpc++, grpc_cpp_plugin)
  protobuf-compiler libprotobuf-dev             # protoc and protobuf for the generated stubs
  help2man                                      # man pages made from --help (packaging/)
  dpkg-dev file                                 # .deb packages: dpkg-shlibdeps (Depends), the package test
  golang-go                                     # the Go binding's tests build it with cgo (bindings/go)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

echo "setup: installing ${#missing[@]} missing package(s): ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
