#include "prom_source.h"
