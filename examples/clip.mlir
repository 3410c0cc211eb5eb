// CLIP's contrastive loss (OpenCLIP ClipLoss) as the program one rank runs.
//
// Each rank holds its own rows of the global batch: L2-normalised image and
// text features (uneven row counts are fine) and the replicated logit scale
// (already exponentiated, as OpenCLIP's model returns it). The loss is the
// mean over the global batch of the image->text and text->image
// cross-entropies, averaged, and is the same on every rank.
func.func @clip(%image: tensor<?x?xf32> {dloss.grad},
                %text: tensor<?x?xf32> {dloss.grad},
                %scale: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %image_all = dloss.all_gather %image axis 0 : tensor<?x?xf32>
  %text_all = dloss.all_gather %text axis 0 : tensor<?x?xf32>

  // The positive of local row i is global row offset + i: right for uneven
  // batches, where `n * rank` is not.
  %offset = dloss.shard_offset %image axis 0 : tensor<?x?xf32>
  %rows = dloss.dim %image axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %offset, %rows : tensor<?xi64>

  %sim_i = dloss.matmul %image, %text_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits_i = dloss.mul %sim_i, %scale : tensor<?x?xf32>, tensor<f32>
  %sim_t = dloss.matmul %text, %image_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits_t = dloss.mul %sim_t, %scale : tensor<?x?xf32>, tensor<f32>

  %ce_i = dloss.cross_entropy %logits_i, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %ce_t = dloss.cross_entropy %logits_t, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum_i = dloss.reduce sum %ce_i axes [0] : tensor<?xf32>
  %sum_t = dloss.reduce sum %ce_t axes [0] : tensor<?xf32>
  %local = dloss.add %sum_i, %sum_t : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %local : tensor<f32>

  // (mean_i + mean_t) / 2 over the global batch = total / (2 * B_global).
  %batch = dloss.global_size %image axis 0 : tensor<?x?xf32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %two = arith.constant dense<2.0> : tensor<f32>
  %denominator = dloss.mul %batch_f, %two : tensor<f32>, tensor<f32>
  %loss = dloss.div %total, %denominator : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
