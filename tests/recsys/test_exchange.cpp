// The variable-size all-to-all under the embedding exchanges: every world size 1-8, empty and odd pieces.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/recsys/exchange.h"

using namespace crosstrain;

namespace {

// Rank s sends (s * 7 + r * 3) % 5 elements to rank r (0 for some pairs), valued 1000 s + r + i / 1000.
int64_t piece_size(int s, int r) { return (s * 7 + r * 3) % 5; }

at::Tensor piece(int s, int r) {
  return at::arange(piece_size(s, r), at::kDouble).div(1000).add(1000.0 * s + r);
}

}  // namespace

TEST(Exchange, AllToAllVMovesEveryPieceToItsRank) {
  for (int world = 1; world <= 8; ++world) {
    comm::FakeWorld::run(world, [&](comm::Communicator& c) {
      const int me = c.rank();
      std::vector<at::Tensor> send;
      at::Tensor counts = at::zeros({world, 1}, at::kLong);
      for (int r = 0; r < world; ++r) {
        send.push_back(piece(me, r));
        counts[r][0] = piece_size(me, r);
      }
      const at::Tensor asked = recsys::exchange_counts(c, counts);
      std::vector<int64_t> expect;
      for (int s = 0; s < world; ++s) {
        EXPECT_EQ(asked[s][0].item<int64_t>(), piece_size(s, me)) << "world " << world;
        expect.push_back(asked[s][0].item<int64_t>());
      }
      int64_t bytes = 0;
      const auto got = recsys::all_to_all_v(c, send, expect, &bytes);
      int64_t sent = 0;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(got[r].numel(), piece_size(r, me));
        EXPECT_TRUE(got[r].equal(piece(r, me))) << "world " << world << " from " << r << " to " << me;
        if (r != me) sent += piece_size(me, r) * 8;
      }
      EXPECT_EQ(bytes, sent) << "only what leaves this rank counts";
    });
  }
}
