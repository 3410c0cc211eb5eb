// RUN: dloss-opt %s --split-input-file --verify-diagnostics
// One case per verifier rule, named after the rule.

// -----

func.func @all_gather_axis_out_of_range(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.all_gather' op axis 2 is out of range for the rank-2 operand 'tensor<?x8xf32>'; axes count from 0}}
  %0 = dloss.all_gather %x axis 2 : tensor<?x8xf32>
  return
}

// -----

func.func @all_gather_negative_axis(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.all_gather' op axis -1 is out of range for the rank-2 operand}}
  %0 = dloss.all_gather %x axis -1 : tensor<?x8xf32>
  return
}

// -----

func.func @all_gather_scalar(%x: tensor<f32>) {
  // expected-error@+1 {{'dloss.all_gather' op axis 0 is out of range for the rank-0 operand}}
  %0 = dloss.all_gather %x axis 0 : tensor<f32>
  return
}

// -----

func.func @all_gather_unknown_grad(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{custom op 'dloss.all_gather' expected one of [exact, local, none] for which gradient flows back through an all_gather, got: partial}}
  %0 = dloss.all_gather %x axis 0 grad partial : tensor<?x8xf32>
  return
}

// -----

func.func @all_gather_result_type_differs(%x: tensor<4x8xf32>) {
  // The gathered axis is dynamic: the global size is known only at run time.
  // expected-error@+2 {{'dloss.all_gather' op inferred type(s) 'tensor<?x8xf32>' are incompatible with return type(s) of operation 'tensor<4x8xf32>'}}
  // expected-error@+1 {{'dloss.all_gather' op failed to infer returned types}}
  %0 = "dloss.all_gather"(%x) <{axis = 0 : i64, grad = #dloss<gather_grad exact>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @all_reduce_unknown_kind(%x: tensor<f32>) {
  // expected-error@+1 {{custom op 'dloss.all_reduce' expected one of [sum, mean, max, min] for how values are combined, got: prod}}
  %0 = dloss.all_reduce prod %x : tensor<f32>
  return
}

// -----

func.func @all_reduce_result_type_differs(%x: tensor<4xf32>) {
  // expected-error@+1 {{'dloss.all_reduce' op requires the same type for all operands and results}}
  %0 = "dloss.all_reduce"(%x) <{kind = #dloss<reduce_kind sum>}> : (tensor<4xf32>) -> tensor<4xf64>
  return
}

// -----

func.func @collective_of_non_tensor(%x: f32) {
  // expected-error@+1 {{'dloss.all_reduce' op operand #0 must be ranked tensor of floating-point or signless integer values, but got 'f32'}}
  %0 = "dloss.all_reduce"(%x) <{kind = #dloss<reduce_kind sum>}> : (f32) -> f32
  return
}

// -----

func.func @reduce_scatter_axis_out_of_range(%x: tensor<?xf32>) {
  // expected-error@+1 {{'dloss.reduce_scatter' op axis 1 is out of range for the rank-1 operand}}
  %0 = dloss.reduce_scatter sum %x axis 1 : tensor<?xf32>
  return
}

// -----

func.func @reduce_scatter_kind_not_sum_or_mean(%x: tensor<?xf32>) {
  // expected-error@+1 {{'dloss.reduce_scatter' op combines with sum or mean, not max; use dloss.all_reduce max and keep this rank's slice}}
  %0 = dloss.reduce_scatter max %x axis 0 : tensor<?xf32>
  return
}

// -----

func.func @broadcast_negative_root(%x: tensor<4xf32>) {
  // expected-error@+1 {{'dloss.broadcast' op root -1 is negative; ranks count from 0}}
  %0 = dloss.broadcast %x root -1 : tensor<4xf32>
  return
}

// -----

func.func @dim_axis_out_of_range(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.dim' op axis 2 is out of range for the rank-2 operand}}
  %0 = dloss.dim %x axis 2 : tensor<?x8xf32>
  return
}

// -----

func.func @shard_offset_axis_out_of_range(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.shard_offset' op axis 3 is out of range for the rank-2 operand}}
  %0 = dloss.shard_offset %x axis 3 : tensor<?x8xf32>
  return
}

// -----

func.func @global_size_axis_out_of_range(%x: tensor<f32>) {
  // expected-error@+1 {{'dloss.global_size' op axis 0 is out of range for the rank-0 operand}}
  %0 = dloss.global_size %x axis 0 : tensor<f32>
  return
}

// -----

func.func @matmul_not_2d(%a: tensor<2x3x4xf32>, %b: tensor<4x5xf32>) {
  // expected-error@+1 {{'dloss.matmul' op multiplies 2-D tensors, got 'tensor<2x3x4xf32>' and 'tensor<4x5xf32>'}}
  %0 = dloss.matmul %a, %b : tensor<2x3x4xf32>, tensor<4x5xf32>
  return
}

// -----

func.func @matmul_element_types_differ(%a: tensor<2x4xf32>, %b: tensor<4x5xbf16>) {
  // expected-error@+1 {{'dloss.matmul' op operand element types differ: 'f32' and 'bf16'; insert a dloss.cast}}
  %0 = dloss.matmul %a, %b : tensor<2x4xf32>, tensor<4x5xbf16>
  return
}

// -----

func.func @matmul_inner_dims_differ(%a: tensor<?x256xf32>, %b: tensor<?x512xf32>) {
  // expected-error@+1 {{'dloss.matmul' op inner dimensions differ: 256 (lhs) vs 512 (rhs, transposed); check the operands or the transpose flags}}
  %0 = dloss.matmul %a, %b transpose_rhs : tensor<?x256xf32>, tensor<?x512xf32>
  return
}

// -----

func.func @matmul_of_integers(%a: tensor<2x4xi32>, %b: tensor<4x5xi32>) {
  // expected-error@+1 {{'dloss.matmul' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<2x4xi32>'}}
  %0 = "dloss.matmul"(%a, %b) : (tensor<2x4xi32>, tensor<4x5xi32>) -> tensor<2x5xi32>
  return
}

// -----

func.func @elementwise_element_types_differ(%a: tensor<?xf32>, %b: tensor<?xf16>) {
  // expected-error@+1 {{'dloss.add' op operand element types differ: 'f32' and 'f16'; insert a dloss.cast}}
  %0 = dloss.add %a, %b : tensor<?xf32>, tensor<?xf16>
  return
}

// -----

func.func @elementwise_shapes_differ(%a: tensor<?x4xf32>, %b: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.mul' op operand shapes [?, 4] and [?, 8] differ; element-wise ops broadcast only 0-d operands}}
  %0 = dloss.mul %a, %b : tensor<?x4xf32>, tensor<?x8xf32>
  return
}

// -----

func.func @elementwise_ranks_differ(%a: tensor<?x4xf32>, %b: tensor<4xf32>) {
  // expected-error@+1 {{'dloss.sub' op operand shapes [?, 4] and [4] differ; element-wise ops broadcast only 0-d operands}}
  %0 = dloss.sub %a, %b : tensor<?x4xf32>, tensor<4xf32>
  return
}

// -----

func.func @div_of_integers(%a: tensor<4xi64>) {
  // expected-error@+1 {{'dloss.div' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi64>'}}
  %0 = "dloss.div"(%a, %a) : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi64>
  return
}

// -----

func.func @unary_of_integers(%a: tensor<4xi64>) {
  // expected-error@+1 {{'dloss.exp' op operand #0 must be ranked tensor of floating-point values, but got 'tensor<4xi64>'}}
  %0 = "dloss.exp"(%a) : (tensor<4xi64>) -> tensor<4xi64>
  return
}

// -----

func.func @clamp_without_bounds(%x: tensor<?xf32>) {
  // expected-error@+1 {{'dloss.clamp' op needs a min, a max or both}}
  %0 = dloss.clamp %x : tensor<?xf32>
  return
}

// -----

func.func @clamp_min_above_max(%x: tensor<?xf32>) {
  // expected-error@+1 {{'dloss.clamp' op min 1.000000e+00 is greater than max -1.000000e+00}}
  %0 = dloss.clamp %x min 1.0 max -1.0 : tensor<?xf32>
  return
}

// -----

func.func @cast_index_to_non_scalar(%n: index) {
  // expected-error@+1 {{'dloss.cast' op casts an index to a 0-d tensor, not to 'tensor<1xf32>'}}
  %0 = dloss.cast %n : index to tensor<1xf32>
  return
}

// -----

func.func @cast_changes_shape(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.cast' op changes only the element type; shapes [?, 4] and [4, 4, 1] differ}}
  %0 = dloss.cast %x : tensor<?x4xf32> to tensor<4x4x1xf32>
  return
}

// -----

func.func @l2_normalize_axis_out_of_range(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.l2_normalize' op axis 2 is out of range for the rank-2 operand}}
  %0 = dloss.l2_normalize %x axis 2 : tensor<?x4xf32>
  return
}

// -----

func.func @l2_normalize_eps_not_positive(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.l2_normalize' op eps must be positive, got 0.000000e+00}}
  %0 = dloss.l2_normalize %x axis 1 eps 0.0 : tensor<?x4xf32>
  return
}

// -----

func.func @l2_normalize_grad_axis_out_of_range(%g: tensor<?x4xf32>, %x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.l2_normalize_grad' op axis -3 is out of range for the rank-2 operand}}
  %0 = dloss.l2_normalize_grad %g, %x axis -3 : tensor<?x4xf32>
  return
}

// -----

func.func @l2_normalize_grad_eps_not_positive(%g: tensor<?x4xf32>, %x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.l2_normalize_grad' op eps must be positive, got -1.000000e+00}}
  %0 = dloss.l2_normalize_grad %g, %x axis 1 eps -1.0 : tensor<?x4xf32>
  return
}

// -----

func.func @l2_normalize_grad_operand_types_differ(%g: tensor<?x4xf32>, %x: tensor<?x4xf64>) {
  // expected-error@+1 {{'dloss.l2_normalize_grad' op requires the same type for all operands and results}}
  %0 = "dloss.l2_normalize_grad"(%g, %x) {axis = 1 : i64} : (tensor<?x4xf32>, tensor<?x4xf64>) -> tensor<?x4xf32>
  return
}

// -----

func.func @reduce_without_axes(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.reduce' op needs at least one axis to reduce}}
  %0 = dloss.reduce sum %x axes [] : tensor<?x4xf32>
  return
}

// -----

func.func @reduce_axis_out_of_range(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.reduce' op axis 2 is out of range for the rank-2 operand}}
  %0 = dloss.reduce sum %x axes [0, 2] : tensor<?x4xf32>
  return
}

// -----

func.func @reduce_axis_twice(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.reduce' op axis 1 is listed twice}}
  %0 = dloss.reduce mean %x axes [1, 1] : tensor<?x4xf32>
  return
}

// -----

func.func @logsumexp_axis_out_of_range(%x: tensor<?xf32>) {
  // expected-error@+1 {{'dloss.logsumexp' op axis 1 is out of range for the rank-1 operand}}
  %0 = dloss.logsumexp %x axis 1 : tensor<?xf32>
  return
}

// -----

func.func @take_along_axis_out_of_range(%x: tensor<?x4xf32>, %i: tensor<?xi64>) {
  // expected-error@+1 {{'dloss.take_along' op axis 2 is out of range for the rank-2 operand}}
  %0 = dloss.take_along %x, %i axis 2 : tensor<?x4xf32>, tensor<?xi64>
  return
}

// -----

func.func @take_along_indices_shape(%x: tensor<?x4xf32>, %i: tensor<?x4xi64>) {
  // expected-error@+1 {{'dloss.take_along' op indices must have the shape of the input without axis 1, [?], got [?, 4]}}
  %0 = dloss.take_along %x, %i axis 1 : tensor<?x4xf32>, tensor<?x4xi64>
  return
}

// -----

func.func @take_along_float_indices(%x: tensor<?x4xf32>, %i: tensor<?xf32>) {
  // expected-error@+1 {{'dloss.take_along' op operand #1 must be ranked tensor of signless integer values, but got 'tensor<?xf32>'}}
  %0 = "dloss.take_along"(%x, %i) <{axis = 1 : i64}> : (tensor<?x4xf32>, tensor<?xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @cross_entropy_targets_shape(%x: tensor<8x4xf32>, %t: tensor<7xi64>) {
  // expected-error@+1 {{'dloss.cross_entropy' op indices must have the shape of the input without axis 1, [8], got [7]}}
  %0 = dloss.cross_entropy %x, %t axis 1 : tensor<8x4xf32>, tensor<7xi64>
  return
}

// -----

func.func @put_along_values_element_type(%x: tensor<?x4xf32>, %i: tensor<?xi64>, %v: tensor<?xf16>) {
  // expected-error@+1 {{'dloss.put_along' op values have element type 'f16' but the input has 'f32'; insert a dloss.cast}}
  %0 = dloss.put_along %x, %i, %v axis 1 : tensor<?x4xf32>, tensor<?xi64>, tensor<?xf16>
  return
}

// -----

func.func @put_along_values_shape(%x: tensor<?x4xf32>, %i: tensor<?xi64>, %v: tensor<?x4xf32>) {
  // expected-error@+1 {{'dloss.put_along' op values must have the shape of the input without axis 1, [?], got [?, 4]}}
  %0 = dloss.put_along %x, %i, %v axis 1 : tensor<?x4xf32>, tensor<?xi64>, tensor<?x4xf32>
  return
}

// -----

func.func @arange_not_1d(%s: index, %n: index) {
  // expected-error@+1 {{'dloss.arange' op produces a 1-D tensor, not 'tensor<?x1xi64>'}}
  %0 = dloss.arange %s, %n : tensor<?x1xi64>
  return
}

// -----
// Entry-point attributes.

// expected-error@+1 {{'dloss.loss' is a unit attribute; write `dloss.loss` without a value}}
func.func @loss_attr_not_unit(%x: tensor<f32>) -> tensor<f32> attributes {dloss.loss = true} {
  return %x : tensor<f32>
}

// -----

func.func @loss_attr_not_on_function(%x: tensor<f32>) -> tensor<f32> {
  // expected-error@+1 {{'dloss.loss' marks a loss entry point and belongs on a func.func, not on 'dloss.all_reduce'}}
  %0 = dloss.all_reduce sum %x {dloss.loss} : tensor<f32>
  return %0 : tensor<f32>
}

// -----

// expected-error@+1 {{loss entry point @loss_without_body has no body; a dloss.loss function must define the per-rank program}}
func.func private @loss_without_body(%x: tensor<f32>) -> tensor<f32> attributes {dloss.loss}

// -----

// expected-error@+1 {{loss entry point @loss_returns_non_scalar must return one 0-d floating-point tensor (the loss) first, got ('tensor<?xf32>'); reduce the loss to a scalar with dloss.reduce and dloss.all_reduce}}
func.func @loss_returns_non_scalar(%x: tensor<?xf32>) -> tensor<?xf32> attributes {dloss.loss} {
  return %x : tensor<?xf32>
}

// -----

// expected-error@+1 {{loss entry point @loss_returns_two_values must return the loss and then one new value per dloss.state argument, of that argument's type (), got ('tensor<f32>') after the loss}}
func.func @loss_returns_two_values(%x: tensor<f32>) -> (tensor<f32>, tensor<f32>) attributes {dloss.loss} {
  return %x, %x : tensor<f32>, tensor<f32>
}

// -----

// expected-error@+1 {{loss entry point @loss_returns_integer must return one 0-d floating-point tensor (the loss) first, got ('tensor<i64>')}}
func.func @loss_returns_integer(%x: tensor<i64>) -> tensor<i64> attributes {dloss.loss} {
  return %x : tensor<i64>
}

// -----

// expected-error@+1 {{'dloss.grad_mode' must be "ddp" or "global", got "mean"}}
func.func @grad_mode_unknown(%x: tensor<f32>) -> tensor<f32> attributes {dloss.loss, dloss.grad_mode = "mean"} {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{'dloss.grad_mode' only applies to a loss entry point; add `dloss.loss` to the function}}
func.func @grad_mode_without_loss(%x: tensor<f32>) -> tensor<f32> attributes {dloss.grad_mode = "ddp"} {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{'dloss.grad' belongs on a function argument, not on 'func.func'}}
func.func @grad_attr_on_function(%x: tensor<f32>) -> tensor<f32> attributes {dloss.loss, dloss.grad} {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{unknown attribute 'dloss.los'; dloss knows dloss.loss, dloss.grad_mode and dloss.gradient_of on functions, dloss.grad, dloss.replicated, dloss.state and dloss.name on arguments, dloss.replication on ops}}
func.func @unknown_function_attr(%x: tensor<f32>) -> tensor<f32> attributes {dloss.los} {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{unknown argument attribute 'dloss.replicate' on argument 0; dloss knows dloss.grad, dloss.replicated, dloss.state and dloss.name on arguments}}
func.func @unknown_argument_attr(%x: tensor<f32> {dloss.replicate}) -> tensor<f32> attributes {dloss.loss} {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{'dloss.replicated' on argument 0 is a unit attribute; write `dloss.replicated` without a value}}
func.func @argument_attr_not_unit(%x: tensor<f32> {dloss.replicated = 1 : i64}) -> tensor<f32> attributes {dloss.loss} {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{'dloss.grad' on argument 0 needs a loss entry point; add `dloss.loss` to the function}}
func.func @grad_without_loss(%x: tensor<f32> {dloss.grad}) -> tensor<f32> {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{'dloss.grad' on argument 1 of type 'tensor<?xi64>': only floating-point tensors have gradients}}
func.func @grad_of_integer_argument(%x: tensor<f32>, %labels: tensor<?xi64> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  return %x : tensor<f32>
}

// -----
// Structural ops.

func.func @expand_axis_out_of_range(%v: tensor<?xf32>, %x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.expand' op axis 2 is out of range for the rank-2 'like' operand 'tensor<?x8xf32>'; axes count from 0}}
  %0 = dloss.expand %v axes [2] like %x : tensor<?xf32>, tensor<?x8xf32>
  return
}

// -----

func.func @expand_axis_twice(%v: tensor<f32>, %x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.expand' op axis 1 is listed twice}}
  %0 = dloss.expand %v axes [1, 1] like %x : tensor<f32>, tensor<?x8xf32>
  return
}

// -----

func.func @expand_input_shape(%v: tensor<4xf32>, %x: tensor<?x8xf32>) {
  // expected-error@+1 {{'dloss.expand' op input shape [4] must be the shape of 'like' without the expanded axes, [8]}}
  %0 = dloss.expand %v axes [0] like %x : tensor<4xf32>, tensor<?x8xf32>
  return
}

// -----

func.func @slice_axis_out_of_range(%x: tensor<?x8xf32>, %o: index) {
  // expected-error@+1 {{'dloss.slice' op axis 2 is out of range for the rank-2 operand}}
  %0 = dloss.slice %x axis 2 offset %o size %o : tensor<?x8xf32>
  return
}

// -----

func.func @pad_axis_out_of_range(%x: tensor<f32>, %o: index) {
  // expected-error@+1 {{'dloss.pad' op axis 0 is out of range for the rank-0 operand}}
  %0 = dloss.pad %x axis 0 low %o high %o : tensor<f32>
  return
}

// -----

func.func @select_value_element_types_differ(%c: tensor<?xi64>, %a: tensor<?xf32>, %b: tensor<?xf64>) {
  // expected-error@+1 {{'dloss.select' op operand element types differ: 'f32' and 'f64'; insert a dloss.cast}}
  %0 = dloss.select %c, %a, %b : tensor<?xi64>, tensor<?xf32>, tensor<?xf64>
  return
}

// -----

func.func @select_value_shape(%c: tensor<?x4xi64>, %a: tensor<?xf32>, %b: tensor<f32>) {
  // expected-error@+1 {{'dloss.select' op the true value has shape [?] but the condition has [?, 4]; a value must have the condition's shape or be 0-d}}
  %0 = dloss.select %c, %a, %b : tensor<?x4xi64>, tensor<?xf32>, tensor<f32>
  return
}

// -----

func.func @eq_element_types_differ(%a: tensor<?xf32>, %b: tensor<?xi32>) {
  // expected-error@+1 {{'dloss.eq' op operand element types differ: 'f32' and 'i32'; insert a dloss.cast}}
  %0 = dloss.eq %a, %b : tensor<?xf32>, tensor<?xi32>
  return
}

// -----

func.func @replication_annotation_unknown(%x: tensor<f32>) {
  // expected-error@+1 {{'dloss.replication' must be "invariant" or "varying", or an array of them (one per result), got "replicated"}}
  %0 = dloss.neg %x {dloss.replication = "replicated"} : tensor<f32>
  return
}

// -----

// expected-error@+1 {{'dloss.name' on argument 0 must be a string, got 3 : i64}}
func.func @name_not_a_string(%x: tensor<f32> {dloss.name = 3}) -> tensor<f32> {
  return %x : tensor<f32>
}

// -----

// expected-error@+1 {{'dloss.gradient_of' names the loss a function differentiates, as a symbol (@loss) on a func.func}}
func.func @gradient_of_not_a_symbol(%x: tensor<f32>) -> tensor<f32> attributes {dloss.gradient_of = "clip"} {
  return %x : tensor<f32>
}

// -----

func.func @fused_similarity_feature_sizes(%r: tensor<?x8xf32>, %c: tensor<?x4xf32>) {
  // expected-error@+1 {{feature sizes differ: 8 vs 4}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x4xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_leaf_counts(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has 1 leaves, fewer than 1 per-row and 1 per-column ones}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 1, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_leaf_rank(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %s: tensor<?xf32>) {
  // expected-error@+1 {{leaf 0 must be a 0-d tensor, got 'tensor<?xf32>'}}
  %0 = dloss.fused_similarity %r, %c leaves(%s) {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_program_size(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed tile program: the program must hold 4 integers per instruction (opcode, a, b, c), got 3}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_unknown_opcode(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed tile program: instruction 1: unknown opcode 99}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 99, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_register_not_earlier(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed tile program: instruction 1: add reads register 1, not an earlier instruction}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 6, 0, 1, 0>, outputs = array<i64: 1, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_leaf_index(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has a malformed tile program: instruction 1: row reads leaf 1 of 1}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 2, 1, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_output_register(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed tile program: result 0 names register 3 of 1}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 3, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_output_reduction(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed tile program: result 0 has unknown reduction 7}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 7>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_result_count(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has 2 results but its program has 1 outputs}}
  %0:2 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> (tensor<?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_result_type(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{each result must be a 1-D tensor of the features' element type, got 'tensor<?x?xf32>'}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x?xf32>
  return
}

// -----

func.func @fused_similarity_grad_extra(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %v: tensor<?xf32>) {
  // expected-error@+1 {{has 1 extra operands, fewer than the forward results and their cotangents (2)}}
  %0:4 = dloss.fused_similarity_grad %r, %c extra(%v) {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_grad_vectors(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %v: tensor<?xf32>, %m: tensor<?x?xf32>) {
  // expected-error@+1 {{each forward result and cotangent must be a 1-D tensor of the features' element type, got 'tensor<?x?xf32>'}}
  %0:4 = dloss.fused_similarity_grad %r, %c extra(%v, %m) {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xf32>, tensor<?x?xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_grad_results(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %v: tensor<?xf32>) {
  // expected-error@+1 {{d_row_leaves must be 2-D and d_scalars 1-D, of 'f32'}}
  %0:4 = dloss.fused_similarity_grad %r, %c extra(%v, %v) {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xf32>, tensor<?xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_facts_required(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{requires attribute 'picks'}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_picks_size(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `picks` holds 1 integers, expected 2 (2 per result: register, leaf; or -1, -1)}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_pick_register(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `picks` entry 0 names register 5 of 2}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 2, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: 5, 0>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_pick_leaf(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `picks` entry 0 names per-row leaf 1 of 1}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 2, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: 0, 1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_pick_is_a_sum(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `picks` entry 0 is a pick, but its result is not a sum}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 2, 0, 0, 0>, outputs = array<i64: 0, 1>, picks = array<i64: 0, 0>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_column_facts_with_column_results(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `col_picks` holds 0 integers, expected 2 (2 per result: register, leaf; or -1, -1)}}
  %0:2 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, gathered, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 1>, col_outputs = array<i64: 0, 1>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> (tensor<?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_lse_pair_of_one_register(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `lse_pairs` entry 0 pairs results that are not log-sum-exps of one register}}
  %0:2 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, gathered, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, col_outputs = array<i64: 0, 1>, picks = array<i64: -1, -1>, col_picks = array<i64: -1, -1>, lse_pairs = array<i64: 0>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> (tensor<?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_lse_pair_once(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `lse_pairs` entry 1 pairs row result 0 a second time}}
  %0:3 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, gathered, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 1>, col_outputs = array<i64: 0, 1, 0, 1>, picks = array<i64: -1, -1>, col_picks = array<i64: -1, -1, -1, -1>, lse_pairs = array<i64: 0, 0>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>)
  return
}

// -----

func.func @fused_similarity_class_targets_ascending(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has facts that do not fit its tile program: `class_targets` must list per-row leaves (of 1) in ascending order, got 1 at 0}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64: 1>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_pick_the_program_lacks(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has `picks` = [0, 0] but its tile program gives [-1, -1]: the facts are derived from the program (leave them to the compiler, or write these)}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 2, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: 0, 0>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_similarity_class_target_the_program_lacks(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>, %t: tensor<?xi64>) {
  // expected-error@+1 {{has `class_targets` = [0] but its tile program gives []}}
  %0 = dloss.fused_similarity %r, %c leaves(%t) {row_leaves = 1, col_leaves = 0, program = array<i64: 0, 0, 0, 0, 2, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64: 0>} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>) -> tensor<?xf32>
  return
}

// -----

// Loss state: the loss returns each dloss.state argument's new value after
// the loss, of its type.
// expected-error@+1 {{loss entry point @state_not_returned must return the loss and then one new value per dloss.state argument, of that argument's type ('tensor<4xf32>'), got () after the loss}}
func.func @state_not_returned(%x: tensor<?x4xf32>, %c: tensor<4xf32> {dloss.replicated, dloss.state}) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// expected-error@+1 {{state argument 1 must be `dloss.replicated` (the same on every rank) and carry no `dloss.grad`: state is updated, not trained}}
func.func @state_not_replicated(%x: tensor<?x4xf32>, %c: tensor<4xf32> {dloss.state}) -> (tensor<f32>, tensor<4xf32>) attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t, %c : tensor<f32>, tensor<4xf32>
}

// -----

func.func @fused_elementwise_leaf_counts(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{has 1 leaves, not 1 (at least 1) of the space's shape, 0 per-row and 1 per-column ones}}
  %0 = dloss.fused_elementwise %x {elements = 1, row_leaves = 0, col_leaves = 1, program = array<i64: 25, 0, 0, 0>, outputs = array<i64: 0>} : (tensor<?x8xf32>) -> tensor<?x8xf32>
  return
}

// -----

func.func @fused_elementwise_outputs(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{has 2 results but its program has 1 outputs and 0 column sums}}
  %0:2 = dloss.fused_elementwise %x {elements = 1, row_leaves = 0, col_leaves = 0, program = array<i64: 25, 0, 0, 0, 10, 0, 0, 0>, outputs = array<i64: 1>} : (tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>)
  return
}

// -----

func.func @fused_elementwise_leaf_types(%x: tensor<?x8xf32>, %c: tensor<4xf32>) {
  // expected-error@+1 {{leaf 1 must be a per-column 1-D tensor of 'f32', got 'tensor<4xf32>'}}
  %0 = dloss.fused_elementwise %x, %c {elements = 1, row_leaves = 0, col_leaves = 1, program = array<i64: 25, 0, 0, 0, 3, 0, 0, 0, 8, 0, 1, 0>, outputs = array<i64: 2>} : (tensor<?x8xf32>, tensor<4xf32>) -> tensor<?x8xf32>
  return
}

// -----

func.func @fused_elementwise_instructions(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed program: instruction 1: exp is not an instruction of a fused element-wise program}}
  %0 = dloss.fused_elementwise %x {elements = 1, row_leaves = 0, col_leaves = 0, program = array<i64: 25, 0, 0, 0, 11, 0, 0, 0>, outputs = array<i64: 1>} : (tensor<?x8xf32>) -> tensor<?x8xf32>
  return
}

// -----

func.func @fused_similarity_has_no_element_leaf(%r: tensor<?x8xf32>, %c: tensor<?x8xf32>) {
  // expected-error@+1 {{has a malformed tile program: instruction 0: element reads leaf 0 of 0}}
  %0 = dloss.fused_similarity %r, %c {row_leaves = 0, col_leaves = 0, program = array<i64: 25, 0, 0, 0>, outputs = array<i64: 0, 0>, picks = array<i64: -1, -1>, class_targets = array<i64>} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?xf32>
  return
}

// -----

func.func @fused_elementwise_column_sums(%x: tensor<?x8xf32>) {
  // expected-error@+1 {{result 1 has type 'tensor<4xf32>', expected one value per column of 'tensor<?x8xf32>'}}
  %0:2 = dloss.fused_elementwise %x {elements = 1, row_leaves = 0, col_leaves = 0, program = array<i64: 25, 0, 0, 0, 10, 0, 0, 0>, outputs = array<i64: 1>, col_sums = array<i64: 1>} : (tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<4xf32>)
  return
}
