#include "redis_source.h"
