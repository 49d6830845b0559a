// Registers per thread after setmaxnreg in the warp-specialized sm_90a kernels (the QAT forward,
// dK/dV): the producer warpgroup keeps the minimum, the consumer warpgroups take the rest of the
// block's share (65536 per SM over the launch's threads x blocks per SM).
#pragma once

namespace fva::dev::sm90 {

template <int kConsumers>
struct RegisterSplit;
template <>
struct RegisterSplit<1> {  // 2 blocks x 256 threads: 128 each at launch (dK/dV)
  static constexpr int kProducer = 24, kConsumer = 232;
};
template <>
struct RegisterSplit<2> {  // 1 block x 384 threads: 168 each at launch (the QAT forward)
  static constexpr int kProducer = 24, kConsumer = 240;
};

}  // namespace fva::dev::sm90
