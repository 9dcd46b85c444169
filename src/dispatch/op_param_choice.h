// A YAML parameter that names one of a fixed set of values (internal): a rule class's
// `kind`, `form` or `direction`.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <string>
#include <vector>

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

// The index of the entry's value of `key` among `choices` (absent: the first), or an
// error naming the YAML entry, the class, the key and the choices.
inline size_t param_choice(const OpParams& p, const std::string& cls, const std::string& key,
                           const std::vector<std::string>& choices) {
  const std::string v = p.get(key, choices.front());
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i] == v) return i;
  }
  TORCH_CHECK(false, p.source(), ": ", cls, " ", key, " '", v, "' is not one of ", c10::Join(", ", choices));
}

}  // namespace hyper_parallel
