#include <torch/torch.h>
#include "core/fsdp/fully_shard.h"
using namespace fsdp2;
int main(){
  comm::RendezvousOptions o; o.store_path = "/tmp/smk" + std::to_string(getpid());
  auto mesh = comm::DeviceMesh::Create(comm::World::Init(o), {1}, {"dp"});
  torch::nn::Linear lin(4, 3);
  fsdp::FSDPOptions fo; fo.mesh = mesh;
  fsdp::fully_shard(lin, fo);
  std::cout << "weight rg " << lin->weight.requires_grad() << " sizes " << lin->weight.sizes() << "\n";
  auto x = torch::randn({2,4});
  fsdp::internal::PreForward(fsdp::internal::FindUnit(lin.ptr().get()));
  std::cout << "after pre: rg " << lin->weight.requires_grad() << " gradfn " << (lin->weight.grad_fn()? lin->weight.grad_fn()->name() : "none") << " sizes " << lin->weight.sizes() << "\n";
  auto y = lin->forward(x);
  std::cout << "y rg " << y.requires_grad() << "\n";
  auto out = fsdp::internal::PostForward(fsdp::internal::FindUnit(lin.ptr().get()), {y});
  std::cout << "out rg " << out[0].requires_grad() << "\n";
  auto z = fsdp::forward(lin, x);
  std::cout << "z rg " << z.requires_grad() << "\n";
}
