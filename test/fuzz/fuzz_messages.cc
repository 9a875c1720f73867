// Fuzzes the negotiation messages the controller parses (GRADCOMP_FUZZ_RESPONSES 0: the
// request lists rank 0 gathers; 1: the response lists every rank receives). Arbitrary bytes
// must parse or throw gradcomp::Error (never crash, never allocate what the message cannot
// hold); what parses must serialize back to the same bytes.
#include <string>
#include <vector>

#include "core/message.h"
#include "ops/common/enforce.h"
#include "test/fuzz/fuzz.h"

#ifndef GRADCOMP_FUZZ_RESPONSES
#error "define GRADCOMP_FUZZ_RESPONSES to 0 or 1"
#endif

namespace gradcomp::fuzz {

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
#if GRADCOMP_FUZZ_RESPONSES
  Response a;
  a.names = {"layer1.weight", "layer1.bias"};
  a.shapes = {{256, 64}, {256}};
  a.compression.codec = "maxmin";
  Response b;
  b.type = RequestType::kAllgather;
  b.names = {"g"};
  b.shapes = {{3, 2}};
  b.rank_dims = {3, 4};
  Response c;
  c.error = "tensor 'x': shapes differ";
  c.names = {"x"};
  Response d;
  d.type = RequestType::kJoin;
  d.last_joined = 1;
  seeds = {SerializeResponses({}), SerializeResponses({a}), SerializeResponses({a, b, c, d})};
#else
  Request a;
  a.name = "layer1.weight";
  a.shape = {256, 64};
  a.compression.codec = "topk";
  a.compression.topk_momentum = 0.9;
  Request b;
  b.rank = 1;
  b.type = RequestType::kAlltoall;
  b.name = "a2a";
  b.dtype = DataType::kInt64;
  b.shape = {4, 3};
  b.splits = {1, 3};
  Request c;
  c.type = RequestType::kBroadcast;
  c.root = 1;
  c.name = "";
  seeds = {SerializeRequests({}), SerializeRequests({a}), SerializeRequests({a, b, c})};
#endif
  return seeds;
}

}  // namespace gradcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradcomp;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::string again;
  try {
#if GRADCOMP_FUZZ_RESPONSES
    again = SerializeResponses(ParseResponses(bytes));
#else
    again = SerializeRequests(ParseRequests(bytes));
#endif
  } catch (const Error&) {
    return 0;  // rejected with a message
  }
  // Booleans are bytes on the wire: any nonzero byte parses as true and serializes as 1, so
  // compare after parsing once more.
#if GRADCOMP_FUZZ_RESPONSES
  if (SerializeResponses(ParseResponses(again)) != again) fuzz::Fail("responses do not round-trip");
#else
  if (SerializeRequests(ParseRequests(again)) != again) fuzz::Fail("requests do not round-trip");
#endif
  return 0;
}
