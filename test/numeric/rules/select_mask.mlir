// select: a -inf mask on the gathered similarity (each row's own column, as
// NT-Xent removes a row's similarity with itself) and a select between two
// differentiable values; the gradient reaches only the chosen value, and
// none reaches a masked entry.
func.func @select_mask(%x: tensor<?x?xf32> {dloss.grad},
                       %y: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %all = dloss.all_gather %x axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %x, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %off = dloss.shard_offset %x axis 0 : tensor<?x?xf32>
  %n = dloss.dim %x axis 0 : tensor<?x?xf32>
  %rows = dloss.arange %off, %n : tensor<?xi64>
  %zero = arith.constant 0 : index
  %g = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %g : tensor<?xi64>
  %r = dloss.expand %rows axes [1] like %sim : tensor<?xi64>, tensor<?x?xf32>
  %c = dloss.expand %cols axes [0] like %sim : tensor<?xi64>, tensor<?x?xf32>
  %self = dloss.eq %r, %c : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %masked = dloss.select %self, %ninf, %sim : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %masked axis 1 : tensor<?x?xf32>
  // A select between two varying values: x on the global diagonal (global
  // row index == column index), y * y elsewhere.
  %yy = dloss.mul %y, %y : tensor<?x?xf32>, tensor<?x?xf32>
  %d = dloss.dim %y axis 1 : tensor<?x?xf32>
  %ycols = dloss.arange %zero, %d : tensor<?xi64>
  %yr = dloss.expand %rows axes [1] like %y : tensor<?xi64>, tensor<?x?xf32>
  %yc = dloss.expand %ycols axes [0] like %y : tensor<?xi64>, tensor<?x?xf32>
  %diag = dloss.eq %yr, %yc : tensor<?x?xi64>, tensor<?x?xi64>
  %both = dloss.select %diag, %x, %yy : tensor<?x?xi64>, tensor<?x?xf32>, tensor<?x?xf32>
  %s1 = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %s2 = dloss.reduce sum %both axes [0, 1] : tensor<?x?xf32>
  %local = dloss.add %s1, %s2 : tensor<f32>, tensor<f32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
