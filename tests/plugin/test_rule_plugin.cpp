// A rule plugin, as a user would write one: loaded through HYPER_PARALLEL_OPS_PLUGIN_PATH.
// It registers a class for YAML (FlipOp) and an op directly (cumsum).
#include <hyper_parallel/hyper_parallel.h>

namespace {

// flip / cumsum along `dims`: a shard on such a dim is gathered first; others stay.
class AlongDimsOp : public hp::DistributedOp {
 public:
  explicit AlongDimsOp(std::string name) : name_(std::move(name)) {}
  std::string class_name() const override { return name_; }
  std::string rule() const override { return "dims operated along are gathered (test plugin)"; }
  hp::ShardingDecision infer_layout(const hp::OpCall& call) const override {
    const hp::Layout& self = call.first_layout();
    std::vector<int64_t> dims;
    const auto& v = call.arg(call.has_arg("dims") ? "dims" : "dim");
    if (v.isInt())
      dims.push_back(v.toInt());
    else
      dims = v.toIntVector();
    hp::Placements want = self.placements();
    for (auto& p : want) {
      for (int64_t d : dims) {
        if (p.is_shard(d < 0 ? d + self.ndim() : d) || p.is_partial()) p = hp::Replicate();
      }
    }
    hp::ShardingDecision out;
    out.input_placements = {want};
    out.output_layouts.push_back({hp::Layout(call.mesh(), want, self.shape())});
    return out;
  }

 private:
  std::string name_;
};

}  // namespace

extern "C" void hyper_parallel_register_ops() {
  hp::register_distributed_op_class("FlipOp",
                                    [](const hp::OpParams&) { return std::make_shared<AlongDimsOp>("FlipOp"); });
  hp::register_distributed_op("cumsum", std::make_shared<AlongDimsOp>("CumsumOp"));
}
