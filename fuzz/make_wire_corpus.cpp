// Writes the wire fuzzer's seed corpus: one signed datagram per sample message of every type
// (tests/io/wire_samples.hpp), named after the type. Usage: make_wire_corpus <dir>
#include "fuzz/wire_fuzz_key.hpp"
#include "leasehold/wire/protocol.hpp"
#include "tests/io/wire_samples.hpp"

#include <cstdio>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  using namespace leasehold::wire;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  Authenticator auth(fuzzing::fuzz_key());
  int n = 0;
  for (const Body& body : samples::every_type()) {
    Header h;
    h.sender = samples::wid(7);
    h.seq = 1000 + static_cast<std::uint64_t>(n);
    h.request_id = 1 + static_cast<std::uint64_t>(n);
    h.key_id = fuzzing::fuzz_key().key_id;  // the receiver's keyring finds the fuzz key by it
    Datagram d;
    const EncodeResult r = encode(h, body, &auth, d.buffer());
    if (!r) {
      std::fprintf(stderr, "cannot encode %s: %s\n", std::string(to_string(type_of(body))).c_str(),
                   std::string(to_string(r.error)).c_str());
      return 1;
    }
    const std::string path = std::string(argv[1]) + "/" + std::to_string(n) + "-" +
                             std::string(to_string(type_of(body))) + ".bin";
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(d.bytes.data()),
                                                static_cast<std::streamsize>(r.bytes));
    ++n;
  }
  std::printf("wrote %d seeds to %s\n", n, argv[1]);
  return 0;
}
