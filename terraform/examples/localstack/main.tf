# A Flotilla cluster with a 2-node pool on LocalStack's EC2, its network made with
# hashicorp/aws: `terraform init && terraform apply` against a running `flotilla up` and
# LocalStack (see ../../README.md). Copy this directory to start your own.

terraform {
  required_providers {
    aws      = { source = "hashicorp/aws", version = "5.100.0" }
    flotilla = { source = "flotilla/flotilla" }
  }
}

variable "localstack" {
  description = "LocalStack's endpoint."
  type        = string
  default     = "http://127.0.0.1:4566"
}

provider "aws" {
  region                      = "us-east-1"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  endpoints {
    ec2 = var.localstack
    sts = var.localstack
  }
}

# Configured by FLOTILLA_CONFIG (the flotilla.json `flotilla up` writes), or set endpoint,
# api_key and ca_file here.
provider "flotilla" {}

module "cluster" {
  source            = "../../modules/cluster"
  name              = "example"
  cloud_endpoint    = var.localstack
  access_key_id     = "test"
  secret_access_key = "test"
  node_count        = 2
  tags              = { team = "platform" }
}

# More pools: the node-pool module, once per pool, e.g.
#   module "batch" {
#     source       = "../../modules/node-pool"
#     cluster_name = module.cluster.cluster_name
#     name         = "batch"
#     desired_size = 1
#     labels       = { workload = "batch" }
#   }

output "endpoint" {
  value = module.cluster.endpoint
}

output "kubeconfig" {
  value = module.cluster.kubeconfig
}
