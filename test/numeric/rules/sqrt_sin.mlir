// sqrt, sin, log, exp, neg and div (both operands varying, and a 0-d divisor).
func.func @sqrt_sin(%x: tensor<?x?xf32> {dloss.grad},
                    %y: tensor<?x?xf32> {dloss.grad},
                    %a: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %x2 = dloss.mul %x, %x : tensor<?x?xf32>, tensor<?x?xf32>
  %one = arith.constant dense<1.0> : tensor<f32>
  %x21 = dloss.add %x2, %one : tensor<?x?xf32>, tensor<f32>
  %r = dloss.sqrt %x21 : tensor<?x?xf32>
  %s = dloss.sin %y : tensor<?x?xf32>
  %q = dloss.div %s, %r : tensor<?x?xf32>, tensor<?x?xf32>
  %ey = dloss.exp %y : tensor<?x?xf32>
  %ley = dloss.log %x21 : tensor<?x?xf32>
  %n = dloss.neg %ley : tensor<?x?xf32>
  %d = dloss.div %ey, %a : tensor<?x?xf32>, tensor<f32>
  %ea = dloss.exp %a : tensor<f32>
  %d2 = dloss.div %n, %ea : tensor<?x?xf32>, tensor<f32>
  %sum1 = dloss.add %q, %d : tensor<?x?xf32>, tensor<?x?xf32>
  %sum = dloss.add %sum1, %d2 : tensor<?x?xf32>, tensor<?x?xf32>
  %local = dloss.reduce sum %sum axes [0, 1] : tensor<?x?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
