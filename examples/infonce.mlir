// InfoNCE (one direction, as in CPC and MoCo's query/key form) as the
// program one rank runs.
//
// Each rank holds its rows of the queries q and of their keys k (row i of
// k is the positive of row i of q; uneven row counts are fine) and the
// replicated scale s = 1 / temperature. q and k are the model's features,
// L2-normalised by it when cosine similarities are wanted. On one device,
// each query's loss is the cross-entropy of its scaled similarities with
// every key of the global batch, its own key being the right class; every
// other key is a negative. Here each rank takes its own queries against
// the gathered keys: the positive of local row i is global key offset + i
// (offset = the shard offset of q, right for uneven batches where
// `n * rank` is not). The loss is the mean over the B queries of the
// global batch, the same on every rank.
func.func @infonce(%q: tensor<?x?xf32> {dloss.grad},
                   %k: tensor<?x?xf32> {dloss.grad},
                   %scale: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %k_all = dloss.all_gather %k axis 0 : tensor<?x?xf32>

  %offset = dloss.shard_offset %q axis 0 : tensor<?x?xf32>
  %n = dloss.dim %q axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %offset, %n : tensor<?xi64>

  %sim = dloss.matmul %q, %k_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %scale : tensor<?x?xf32>, tensor<f32>
  %ce = dloss.cross_entropy %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>

  %local = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %batch = dloss.global_size %q axis 0 : tensor<?x?xf32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %loss = dloss.div %total, %batch_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
