// dloss's declarations of Gloo's names
// (runtime/comm/gloo-declarations/README.md): c10d's ProcessGroupGloo.hpp
// includes this header but uses nothing of it.
#pragma once
