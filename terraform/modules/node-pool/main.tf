# A node pool of a Flotilla cluster: EC2 instances of the cluster's node image that join it,
# with labels and taints; usable more than once per cluster.

terraform {
  required_providers {
    flotilla = { source = "flotilla/flotilla" }
  }
}

variable "cluster_name" {
  description = "The pool's cluster."
  type        = string
}

variable "name" {
  description = "The pool's name."
  type        = string
}

variable "instance_types" {
  description = "Instance types; the first is launched."
  type        = list(string)
  default     = ["t3.medium"]
}

variable "min_size" {
  type    = number
  default = 1
}

variable "max_size" {
  type    = number
  default = 3
}

variable "desired_size" {
  type    = number
  default = 2
}

variable "labels" {
  description = "Labels of the pool's Nodes."
  type        = map(string)
  default     = {}
}

variable "taints" {
  description = "Taints of the pool's Nodes (effect: NO_SCHEDULE, NO_EXECUTE or PREFER_NO_SCHEDULE)."
  type = list(object({
    key    = string
    value  = optional(string)
    effect = string
  }))
  default = []
}

variable "subnet_ids" {
  description = "Subnets (default: the cluster's)."
  type        = list(string)
  default     = null
}

resource "flotilla_node_pool" "this" {
  cluster_name   = var.cluster_name
  name           = var.name
  instance_types = var.instance_types
  min_size       = var.min_size
  max_size       = var.max_size
  desired_size   = var.desired_size
  labels         = var.labels
  subnets        = var.subnet_ids
  dynamic "taint" {
    for_each = var.taints
    content {
      key    = taint.value.key
      value  = taint.value.value
      effect = taint.value.effect
    }
  }
}

output "name" {
  value = flotilla_node_pool.this.name
}

output "instance_ids" {
  value = flotilla_node_pool.this.instance_ids
}
