// SigLIP's sigmoid loss as the program one rank runs.
//
// Every (image, text) pair of the global batch is a binary problem: positive
// on the global diagonal, negative elsewhere. With l = t * <x_i, y_j> + b and
// t = exp(log_t), the loss is -1/B * sum_ij log sigmoid(z_ij * l_ij), z = +1 on
// the diagonal and -1 elsewhere. Since -log sigmoid(-l) = softplus(l) and
// -log sigmoid(l) = softplus(l) - l, this is
//   (sum_ij softplus(l_ij) - sum_i l_ii) / B,
// so no B x B label matrix is needed.
func.func @siglip(%image: tensor<?x?xf32> {dloss.grad},
                  %text: tensor<?x?xf32> {dloss.grad},
                  %log_t: tensor<f32> {dloss.grad, dloss.replicated},
                  %bias: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %text_all = dloss.all_gather %text axis 0 : tensor<?x?xf32>
  %offset = dloss.shard_offset %image axis 0 : tensor<?x?xf32>
  %rows = dloss.dim %image axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %offset, %rows : tensor<?xi64>

  %t = dloss.exp %log_t : tensor<f32>
  %sim = dloss.matmul %image, %text_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %scaled = dloss.mul %sim, %t : tensor<?x?xf32>, tensor<f32>
  %logits = dloss.add %scaled, %bias : tensor<?x?xf32>, tensor<f32>

  %pairs = dloss.softplus %logits : tensor<?x?xf32>
  %pairs_sum = dloss.reduce sum %pairs axes [0, 1] : tensor<?x?xf32>
  %positives = dloss.take_along %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %positives_sum = dloss.reduce sum %positives axes [0] : tensor<?xf32>
  %local = dloss.sub %pairs_sum, %positives_sum : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %local : tensor<f32>

  %batch = dloss.global_size %image axis 0 : tensor<?x?xf32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %loss = dloss.div %total, %batch_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
