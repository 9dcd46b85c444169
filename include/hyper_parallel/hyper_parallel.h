// HyperParallel C++: tensor parallelism for LibTorch. One include for all of it.
#pragma once

#include "hyper_parallel/communicator.h"
#include "hyper_parallel/device_mesh.h"
#include "hyper_parallel/dispatch.h"
#include "hyper_parallel/distributed.h"
#include "hyper_parallel/distributed_op.h"
#include "hyper_parallel/dtensor.h"
#include "hyper_parallel/layout.h"
#include "hyper_parallel/loss_parallel.h"
#include "hyper_parallel/module_utils.h"
#include "hyper_parallel/parallel_style.h"
#include "hyper_parallel/parallelism_config.h"
#include "hyper_parallel/placement.h"
#include "hyper_parallel/sharding_strategy.h"

namespace hp = hyper_parallel;
