#include "loss/call/input_agreement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/core/communicator.h"
#include "loss/call/loss_call_site.h"

namespace hyper_parallel {

namespace {

// FNV-1a of a tensor's bytes: equal on every rank iff the values are.
uint64_t bytes_hash(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

bool check_replicated_enabled() {
  const char* v = std::getenv("HYPER_PARALLEL_CHECK_REPLICATED");
  return v && std::string(v) == "1";
}

std::string join_ranks(const std::vector<int64_t>& ranks) {
  std::string s;
  for (int64_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// The refused ranks' messages (truncated), one all_reduce in which each rank fills its slot.
std::vector<std::string> exchange_messages(const std::string& own, const Communicator& comm, const at::Device& device) {
  constexpr int64_t kSlot = 512;
  const int64_t n = comm.size();
  at::Tensor slots = at::zeros({n * kSlot}, at::kByte);
  std::memcpy(slots.data_ptr<uint8_t>() + comm.rank() * kSlot, own.data(), std::min<size_t>(own.size(), kSlot - 1));
  slots = slots.to(device);
  comm.all_reduce_(slots, ReduceOp::Sum);
  const at::Tensor all = slots.cpu();
  std::vector<std::string> out;
  for (int64_t r = 0; r < n; ++r) out.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * kSlot));
  return out;
}

// A refused rank's message without the op's name, which the settled error already leads with.
std::string without_prefix(const std::string& message, const std::string& op) {
  for (const std::string& p : {loss_call_site(op) + ": ", op + ": ", std::string("vocab_parallel: ")}) {
    if (message.rfind(p, 0) == 0) return message.substr(p.size());
  }
  return message;
}

}  // namespace

InputAgreement::InputAgreement(std::string op, const at::Tensor& replicated, const std::function<void()>& checks)
    : op_(std::move(op)), compare_(check_replicated_enabled()) {
  try {
    checks();
  } catch (const c10::Error& e) {
    own_ = std::current_exception();
    message_ = e.what_without_backtrace();
  } catch (const std::exception& e) {
    own_ = std::current_exception();
    message_ = e.what();
  }
  // A DTensor laid out like the logits (probabilities, sharded) legitimately differs between
  // ranks: only plain and replicated tensors are compared.
  const auto* impl = replicated.defined() ? dtensor_impl(replicated) : nullptr;
  if (compare_ && !own_ && replicated.defined() && !replicated.is_meta() && (!impl || impl->layout().is_replicated())) {
    target_hash_ = bytes_hash(impl ? impl->local() : replicated);
  }
}

void InputAgreement::write_record(const at::Tensor& record) const {
  std::vector<double> v(kRecordSize, 0.0);
  v[0] = own_ ? 1.0 : 0.0;
  for (int i = 0; i < 4; ++i) v[1 + i] = static_cast<double>((target_hash_ >> (16 * i)) & 0xffffu);
  record.copy_(at::tensor(v, at::kDouble));
}

void InputAgreement::settle(const at::Tensor& records, const Communicator* comm) const {
  // A dry run's records are meta tensors (hp-dry-run): shapes only, no refusal to read.
  // This rank's own refusal still stops it.
  if (records.is_meta()) {
    if (own_) std::rethrow_exception(own_);
    return;
  }
  const at::Tensor r = records.to(at::kCPU, at::kDouble).contiguous();
  const int64_t n = r.size(0);
  const double* v = r.data_ptr<double>();
  std::vector<int64_t> refused;
  for (int64_t p = 0; p < n; ++p) {
    if (v[p * kRecordSize] != 0) refused.push_back(p);
  }
  if (!refused.empty()) {
    // Every rank sees the same records, so every rank takes this path (and its collective).
    const std::vector<std::string> messages =
        comm ? exchange_messages(message_, *comm, records.device()) : std::vector<std::string>{message_};
    const std::string& first = messages[refused.front()];
    const bool everywhere_alike =
        static_cast<int64_t>(refused.size()) == n &&
        std::all_of(refused.begin(), refused.end(), [&](int64_t p) { return messages[p] == first; });
    // Inputs equal on every rank fail equally everywhere: keep the error's own type then.
    if (own_ && everywhere_alike) std::rethrow_exception(own_);
    // Where, not a guess at why: the same value on every rank can be wrong on some (a
    // vocab_size that fits rank 0's piece only), so no input is said to differ unless compared.
    TORCH_CHECK(false, loss_call_site(op_), ": the inputs were refused on rank(s) ", join_ranks(refused),
                " of the loss's group; on rank ", refused.front(), ": ", without_prefix(first, op_),
                compare_ ? "" : " (HYPER_PARALLEL_CHECK_REPLICATED=1 also compares the ranks' targets)");
  }
  if (!compare_) return;
  std::vector<int64_t> differ;
  for (int64_t p = 1; p < n; ++p) {
    if (!std::equal(v + p * kRecordSize + 1, v + (p + 1) * kRecordSize, v + 1)) differ.push_back(p);
  }
  TORCH_CHECK(differ.empty(), loss_call_site(op_),
              " (HYPER_PARALLEL_CHECK_REPLICATED=1): the target differs "
              "between ranks: rank(s) ",
              join_ranks(differ),
              " of the loss's group hold a different target than "
              "rank 0; a replicated target must be identical on every rank");
}

}  // namespace hyper_parallel
