// open_flat_token_file: one document spanning the file, no separators added.
#include "train/data/flat_token_file.h"

#include <c10/util/Exception.h>

#include "io/mapped_file.h"

namespace hyper_parallel::train {

std::shared_ptr<const TokenDocuments> open_flat_token_file(const std::string& path, TokenDtype dtype,
                                                           int64_t vocab_size) {
  auto file = std::make_shared<const io::MappedFile>(path);
  const int64_t item = token_dtype_size(dtype);
  TORCH_CHECK(file->size() > 0, "token file '", path, "' is empty");
  TORCH_CHECK(file->size() % item == 0, "token file '", path, "' has ", file->size(), " bytes, not a whole number of ",
              token_dtype_name(dtype), " tokens (", item, " bytes each): truncated, or not ", token_dtype_name(dtype),
              " (set training.data_format)");
  const int64_t tokens = file->size() / item;
  return std::make_shared<const TokenDocuments>(std::move(file), dtype, std::vector<int64_t>{0, tokens},
                                                DocumentSeparators{}, vocab_size);
}

}  // namespace hyper_parallel::train
