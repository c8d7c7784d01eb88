#include "crosstrain/recsys/exchange.h"

#include <ATen/ATen.h>

namespace crosstrain::recsys {
namespace {
constexpr int kExchangeTag = 0x5e1;  // apart from the tags of pipeline and parameter-server traffic
}

at::Tensor exchange_counts(comm::Communicator& c, const at::Tensor& counts) {
  at::Tensor in = counts.contiguous();
  at::Tensor out = at::empty_like(in);
  if (c.size() == 1) return in.clone();
  c.all_to_all(in, out)->wait();
  return out;
}

std::vector<at::Tensor> all_to_all_v(comm::Communicator& c, const std::vector<at::Tensor>& send,
                                     const std::vector<int64_t>& recv_numel, int64_t* bytes_sent) {
  const int n = c.size(), me = c.rank();
  std::vector<at::Tensor> recv(n);
  recv[me] = send[me];
  for (int k = 1; k < n; ++k) {
    const int dst = (me + k) % n, src = (me - k + n) % n;
    comm::WorkPtr sent, got;
    at::Tensor out = at::empty({recv_numel[src]}, send[dst].options());
    if (send[dst].numel() > 0) {
      sent = c.send(send[dst], dst, kExchangeTag);
      if (bytes_sent) *bytes_sent += send[dst].numel() * static_cast<int64_t>(send[dst].element_size());
    }
    if (recv_numel[src] > 0) got = c.recv(out, src, kExchangeTag);
    if (sent) sent->wait();
    if (got) got->wait();
    recv[src] = out;
  }
  return recv;
}

}  // namespace crosstrain::recsys
