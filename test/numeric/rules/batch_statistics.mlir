// Statistics of the global batch, as @dloss.loss records lightly's Barlow
// Twins: F.batch_norm(training=True) of both views (the global mean, then
// the global biased variance: all-reduced sums over global counts), their
// cross-correlation (x.T @ y contracting the batch, all-reduced), its
// diagonal and off-diagonal terms through an identity mask, and an unbiased
// std (global count - 1). The adjoint of each statistic (SyncBatchNorm's
// backward included) comes from the rules of its ops.
func.func @batch_norm_stats(%arg0: tensor<?x3xf32> {dloss.grad}, %arg1: tensor<?x3xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %0 = dloss.arange %c0, %c3 : tensor<?xi64>
  %1 = dloss.reduce sum %arg0 axes [0] : tensor<?x3xf32>
  %2 = dloss.all_reduce sum %1 : tensor<3xf32>
  %3 = dloss.global_size %arg0 axis 0 : tensor<?x3xf32>
  %4 = dloss.cast %3 : index to tensor<f32>
  %5 = dloss.div %2, %4 : tensor<3xf32>, tensor<f32>
  %6 = dloss.expand %5 axes [0] like %arg0 : tensor<3xf32>, tensor<?x3xf32>
  %7 = dloss.sub %arg0, %6 : tensor<?x3xf32>, tensor<?x3xf32>
  %8 = dloss.mul %7, %7 : tensor<?x3xf32>, tensor<?x3xf32>
  %9 = dloss.reduce sum %8 axes [0] : tensor<?x3xf32>
  %10 = dloss.all_reduce sum %9 : tensor<3xf32>
  %11 = dloss.cast %3 : index to tensor<f32>
  %12 = dloss.div %10, %11 : tensor<3xf32>, tensor<f32>
  %13 = dloss.expand %5 axes [0] like %arg0 : tensor<3xf32>, tensor<?x3xf32>
  %14 = dloss.sub %arg0, %13 : tensor<?x3xf32>, tensor<?x3xf32>
  %cst = arith.constant dense<9.99999974E-6> : tensor<f32>
  %15 = dloss.add %12, %cst : tensor<3xf32>, tensor<f32>
  %16 = dloss.sqrt %15 : tensor<3xf32>
  %17 = dloss.expand %16 axes [0] like %14 : tensor<3xf32>, tensor<?x3xf32>
  %18 = dloss.div %14, %17 : tensor<?x3xf32>, tensor<?x3xf32>
  %19 = dloss.reduce sum %arg1 axes [0] : tensor<?x3xf32>
  %20 = dloss.all_reduce sum %19 : tensor<3xf32>
  %21 = dloss.global_size %arg1 axis 0 : tensor<?x3xf32>
  %22 = dloss.cast %21 : index to tensor<f32>
  %23 = dloss.div %20, %22 : tensor<3xf32>, tensor<f32>
  %24 = dloss.expand %23 axes [0] like %arg1 : tensor<3xf32>, tensor<?x3xf32>
  %25 = dloss.sub %arg1, %24 : tensor<?x3xf32>, tensor<?x3xf32>
  %26 = dloss.mul %25, %25 : tensor<?x3xf32>, tensor<?x3xf32>
  %27 = dloss.reduce sum %26 axes [0] : tensor<?x3xf32>
  %28 = dloss.all_reduce sum %27 : tensor<3xf32>
  %29 = dloss.cast %21 : index to tensor<f32>
  %30 = dloss.div %28, %29 : tensor<3xf32>, tensor<f32>
  %31 = dloss.expand %23 axes [0] like %arg1 : tensor<3xf32>, tensor<?x3xf32>
  %32 = dloss.sub %arg1, %31 : tensor<?x3xf32>, tensor<?x3xf32>
  %cst_0 = arith.constant dense<9.99999974E-6> : tensor<f32>
  %33 = dloss.add %30, %cst_0 : tensor<3xf32>, tensor<f32>
  %34 = dloss.sqrt %33 : tensor<3xf32>
  %35 = dloss.expand %34 axes [0] like %32 : tensor<3xf32>, tensor<?x3xf32>
  %36 = dloss.div %32, %35 : tensor<?x3xf32>, tensor<?x3xf32>
  %37 = dloss.matmul %18, %36 transpose_lhs : tensor<?x3xf32>, tensor<?x3xf32>
  %38 = dloss.all_reduce sum %37 : tensor<3x3xf32>
  %39 = dloss.cast %3 : index to tensor<f32>
  %40 = dloss.div %38, %39 : tensor<3x3xf32>, tensor<f32>
  %41 = dloss.expand %0 axes [1] like %40 : tensor<?xi64>, tensor<3x3xf32>
  %42 = dloss.expand %0 axes [0] like %40 : tensor<?xi64>, tensor<3x3xf32>
  %43 = dloss.eq %41, %42 : tensor<3x3xi64>, tensor<3x3xi64>
  %cst_1 = arith.constant dense<0.000000e+00> : tensor<f32>
  %44 = dloss.select %43, %40, %cst_1 : tensor<3x3xi64>, tensor<3x3xf32>, tensor<f32>
  %45 = dloss.reduce sum %44 axes [1] : tensor<3x3xf32>
  %cst_2 = arith.constant dense<1.000000e+00> : tensor<f32>
  %46 = dloss.sub %45, %cst_2 : tensor<3xf32>, tensor<f32>
  %47 = dloss.mul %46, %46 : tensor<3xf32>, tensor<3xf32>
  %48 = dloss.reduce sum %47 axes [0] : tensor<3xf32>
  %49 = dloss.expand %0 axes [1] like %40 : tensor<?xi64>, tensor<3x3xf32>
  %50 = dloss.expand %0 axes [0] like %40 : tensor<?xi64>, tensor<3x3xf32>
  %51 = dloss.eq %49, %50 : tensor<3x3xi64>, tensor<3x3xi64>
  %cst_3 = arith.constant dense<1> : tensor<i64>
  %52 = dloss.sub %cst_3, %51 : tensor<i64>, tensor<3x3xi64>
  %cst_4 = arith.constant dense<0.000000e+00> : tensor<f32>
  %53 = dloss.select %52, %40, %cst_4 : tensor<3x3xi64>, tensor<3x3xf32>, tensor<f32>
  %54 = dloss.mul %53, %53 : tensor<3x3xf32>, tensor<3x3xf32>
  %55 = dloss.reduce sum %54 axes [0, 1] : tensor<3x3xf32>
  %cst_5 = arith.constant dense<5.000000e-01> : tensor<f32>
  %56 = dloss.mul %cst_5, %55 : tensor<f32>, tensor<f32>
  %57 = dloss.add %48, %56 : tensor<f32>, tensor<f32>
  %58 = dloss.reduce sum %arg1 axes [0] : tensor<?x3xf32>
  %59 = dloss.all_reduce sum %58 : tensor<3xf32>
  %60 = dloss.cast %21 : index to tensor<f32>
  %61 = dloss.div %59, %60 : tensor<3xf32>, tensor<f32>
  %62 = dloss.expand %61 axes [0] like %arg1 : tensor<3xf32>, tensor<?x3xf32>
  %63 = dloss.sub %arg1, %62 : tensor<?x3xf32>, tensor<?x3xf32>
  %64 = dloss.mul %63, %63 : tensor<?x3xf32>, tensor<?x3xf32>
  %65 = dloss.reduce sum %64 axes [0] : tensor<?x3xf32>
  %66 = dloss.all_reduce sum %65 : tensor<3xf32>
  %c1 = arith.constant 1 : index
  %67 = arith.subi %21, %c1 : index
  %68 = dloss.cast %67 : index to tensor<f32>
  %69 = dloss.div %66, %68 : tensor<3xf32>, tensor<f32>
  %70 = dloss.sqrt %69 : tensor<3xf32>
  %71 = dloss.reduce sum %70 axes [0] : tensor<3xf32>
  %72 = dloss.add %57, %71 : tensor<f32>, tensor<f32>
  return %72 : tensor<f32>
}
