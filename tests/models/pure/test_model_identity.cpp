// Which [model] fields make a checkpoint another model's (models/model_identity.h), as --resume reports them.
#include <gtest/gtest.h>

#include "crosstrain/models/model_identity.h"

using crosstrain::models::GPTConfig;
using crosstrain::models::ModelArch;
using crosstrain::models::model_differences;
using crosstrain::models::shortest_number;
using Lines = std::vector<std::string>;

namespace {

GPTConfig llama() {
  GPTConfig c;
  c.arch = ModelArch::Llama;
  c.n_head = 4;
  c.n_embd = 64;
  return c;
}

}  // namespace

TEST(ModelIdentity, TheSameModelHasNoDifferences) {
  EXPECT_EQ(model_differences(GPTConfig{}, GPTConfig{}), Lines{});
  EXPECT_EQ(model_differences(llama(), llama()), Lines{});
}

TEST(ModelIdentity, EachShapeFieldIsNamedWithBothValues) {
  const GPTConfig saved;
  GPTConfig now = saved;
  now.n_layer = 2;
  EXPECT_EQ(model_differences(saved, now), Lines{"model.n_layer: 4 -> 2"});
  now.n_head = 8;
  now.n_embd = 256;
  now.vocab_size = 512;
  now.block_size = 64;
  now.lora_rank = 4;
  EXPECT_EQ(model_differences(saved, now),
            (Lines{"model.n_layer: 4 -> 2", "model.n_head: 4 -> 8", "model.n_embd: 128 -> 256",
                   "model.vocab_size: 256 -> 512", "model.block_size: 128 -> 64", "model.lora_rank: 0 -> 4"}));
}

TEST(ModelIdentity, ArchIsNamedFirstAndFamilyFieldsOnlyBetweenLlamas) {
  GPTConfig gpt;
  GPTConfig now = gpt;
  now.arch = ModelArch::Llama;
  now.tie_embeddings = true;
  now.rope_theta = 500000;
  EXPECT_EQ(model_differences(gpt, now), Lines{"model.arch: \"gpt\" -> \"llama\""});
  now.n_layer = 6;
  EXPECT_EQ(model_differences(gpt, now), (Lines{"model.arch: \"gpt\" -> \"llama\"", "model.n_layer: 4 -> 6"}));
  // gpt ignores the llama fields.
  GPTConfig gpt2 = gpt;
  gpt2.n_kv_head = 2;
  gpt2.ffn_hidden = 96;
  gpt2.tie_embeddings = true;
  gpt2.rope_theta = 1e6;
  EXPECT_EQ(model_differences(gpt, gpt2), Lines{});
}

TEST(ModelIdentity, LlamaFieldsCompareByTheirEffectiveValues) {
  const GPTConfig saved = llama();
  GPTConfig now = saved;
  now.n_kv_head = 4;     // = n_head, as 0 means
  now.ffn_hidden = 192;  // 8 * 64 / 3 rounded up to 32, as 0 means
  EXPECT_EQ(model_differences(saved, now), Lines{});
  now.n_kv_head = 2;
  now.ffn_hidden = 256;
  now.tie_embeddings = true;
  now.rope_theta = 500000;
  EXPECT_EQ(model_differences(saved, now),
            (Lines{"model.n_kv_head: 4 -> 2", "model.ffn_hidden: 192 -> 256", "model.tie_embeddings: false -> true",
                   "model.rope_theta: 10000 -> 500000"}));
  // n_head changes the default key/value heads too, but that is one change, named once.
  GPTConfig heads = saved;
  heads.n_head = 8;
  EXPECT_EQ(model_differences(saved, heads), Lines{"model.n_head: 4 -> 8"});
}

TEST(ModelIdentity, DropoutAndNormEpsChangeNoTensor) {
  GPTConfig saved = llama();
  GPTConfig now = saved;
  now.dropout = 0.1;
  now.norm_eps = 1e-6;
  EXPECT_EQ(model_differences(saved, now), Lines{});
  now.rope_theta = saved.rope_theta * (1 + 1e-15);  // read back from the saved TOML text
  EXPECT_EQ(model_differences(saved, now), Lines{});
}

TEST(ModelIdentity, LoraAlphaCountsAsTheAdaptersScale) {
  GPTConfig saved;
  saved.lora_rank = 8;
  GPTConfig now = saved;
  now.lora_alpha = 8;  // alpha = rank: the same scale as 0
  EXPECT_EQ(model_differences(saved, now), Lines{});
  now.lora_alpha = 16;
  EXPECT_EQ(model_differences(saved, now), Lines{"model.lora_alpha: 0 -> 16"});
  GPTConfig plain, plain_alpha;
  plain_alpha.lora_alpha = 16;  // no adapters: alpha means nothing
  EXPECT_EQ(model_differences(plain, plain_alpha), Lines{});
}

TEST(ModelIdentity, DlrmShapesAreTheDlrmSectionsToCompare) {
  GPTConfig a, b;
  a.arch = b.arch = ModelArch::Dlrm;
  b.n_layer = 9;
  EXPECT_EQ(model_differences(a, b), Lines{});
  EXPECT_EQ(model_differences(a, GPTConfig{}), Lines{"model.arch: \"dlrm\" -> \"gpt\""});
}

TEST(ModelIdentity, NumbersAreShownAsShortAsTheyReadBack) {
  EXPECT_EQ(shortest_number(10000), "10000");
  EXPECT_EQ(shortest_number(0.1), "0.1");
  EXPECT_EQ(shortest_number(1e-5), "1e-05");
  EXPECT_EQ(shortest_number(500000), "500000");
}
