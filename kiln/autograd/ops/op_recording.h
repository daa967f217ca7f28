// kiln/autograd/ops/op_recording.h — what every op family file in kiln/autograd/ops/ uses to record
// itself: the declarations it implements (functions.h), the graph helpers (node.h) and the autocast hook,
// under the short names the files use. Internal: include it only from kiln/autograd/ops/*.cpp.
#pragma once

#include "kiln/autograd/autocast.h"   // autocast::inputs, autocast::Op
#include "kiln/autograd/functions.h"  // the differentiable ops these files define
#include "kiln/autograd/node.h"       // Node, SavedTensor, make_node, set_history, needs_grad, check_inplace

namespace kiln {

using autocast::Op;
using autograd::check_inplace;
using autograd::make_node;
using autograd::needs_grad;
using autograd::Node;
using autograd::SavedTensor;
using autograd::set_history;
using autograd::TensorList;

}  // namespace kiln
