// A loss computed in f64 throughout: an InfoNCE-style loss over the gathered
// batch (all_gather with its reduce_scatter adjoint, uneven row offsets), a
// replicated f64 scale, and an f64 all_reduce. Through the runtime its inputs
// are float64 .npy files (the gradients come back in float32).
func.func @float64(%q: tensor<?x?xf64> {dloss.grad},
                   %k: tensor<?x?xf64> {dloss.grad},
                   %scale: tensor<f64> {dloss.grad, dloss.replicated}) -> tensor<f64>
    attributes {dloss.loss} {
  %kall = dloss.all_gather %k axis 0 : tensor<?x?xf64>
  %off = dloss.shard_offset %q axis 0 : tensor<?x?xf64>
  %rows = dloss.dim %q axis 0 : tensor<?x?xf64>
  %labels = dloss.arange %off, %rows : tensor<?xi64>
  %sim = dloss.matmul %q, %kall transpose_rhs : tensor<?x?xf64>, tensor<?x?xf64>
  %logits = dloss.mul %sim, %scale : tensor<?x?xf64>, tensor<f64>
  %ce = dloss.cross_entropy %logits, %labels axis 1 : tensor<?x?xf64>, tensor<?xi64>
  %local = dloss.reduce sum %ce axes [0] : tensor<?xf64>
  %total = dloss.all_reduce sum %local : tensor<f64>
  %b = dloss.global_size %q axis 0 : tensor<?x?xf64>
  %bf = dloss.cast %b : index to tensor<f64>
  %loss = dloss.div %total, %bf : tensor<f64>, tensor<f64>
  return %loss : tensor<f64>
}
