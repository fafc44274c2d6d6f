// SentencePiece models (tokenizer.model: Llama 2 and others) through
// libsentencepiece, so the ids are SentencePiece's own.
#pragma once

#include <memory>
#include <string>

#include "text/tokenizer.h"

namespace meshlm::text {

// Throws RankError naming the file when libsentencepiece cannot load it.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& path);

}  // namespace meshlm::text
